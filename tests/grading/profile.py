"""Which tests the student sees and which only the autograder has.

HIDDEN_TESTS exist only in the autograder (make_handout.py leaves them out of the student's copy):
the integrity checks that prove each strategy does what it claims, and the DDP-parity hard cases.
"""
HIDDEN_TESTS = ("tests/test_integrity.py", "tests/test_ddp_parity.py")
