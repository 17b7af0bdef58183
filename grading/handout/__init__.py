"""What make_handout.py is made of: the solution regions (regions.py), the student's repository
and the autograder (build.py), and the student's ASSIGNMENT.md (assignment.py, from
ASSIGNMENT.md.in). setup.sh and run_autograder are the autograder's two scripts, copied as they are.
"""
