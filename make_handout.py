"""Make the assignment from the solution: the student's repository and Gradescope's autograder.

    python make_handout.py OUT_DIR            # OUT_DIR/student/, OUT_DIR/autograder/, .zip
    python make_handout.py OUT_DIR --force    # replace those three in a folder that is not empty
    python make_handout.py OUT_DIR --source /path/to/solution    # from another checkout
    python make_handout.py --self-check OUT_DIR  # then grade it untouched, and with the solution
    python make_handout.py --self-check --per-item OUT_DIR  # and with each item alone (~10 min)
    python make_handout.py --hints steps OUT_DIR  # prompts with step-by-step hints

Each solution region (grading/handout/regions.py says how they are marked) becomes its prompt and a
`raise NotImplementedError`; a wrong marker stops the build with its file and line, and writes
nothing (exit 2). Upload OUT_DIR/autograder.zip to Gradescope.

Every prompt states its contract: what must hold when the code returns, and the interface.
--hints chooses how much help follows it: none (the contract alone, as Stanford's CS336 gives an
interface and tests), outline (the default: the approach in a sentence or two, which leaves every
line to the student), or steps (the outline and then each step, nearly pseudocode: for a class
new to distributed code, at the cost of telling students' code apart). The tests and the grading
are the same at every level.
"""
import os
import sys

from grading.handout import build, regions, self_check
from runtime.options import OneLineParser

REPO = os.path.dirname(os.path.abspath(__file__))


def main(argv=None):
    """Build the handout into OUT_DIR; exit 2 with one line where it cannot."""
    parser = OneLineParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out_dir", metavar="OUT_DIR")
    parser.add_argument("--force", action="store_true",
                        help="replace student/, autograder/ and autograder.zip in a folder that "
                             "is not empty (nothing else in it is touched)")
    parser.add_argument("--source", default=REPO,
                        help="the solution's git checkout (default: the one this file is in)")
    parser.add_argument("--self-check", action="store_true",
                        help="grade the handout untouched (every core item must earn 0, fast) "
                             "and with the solution put back (full marks); exit 1 if not")
    parser.add_argument("--hints", choices=regions.HINT_LEVELS, default=regions.DEFAULT_HINTS,
                        help="how much of each prompt the student sees: the contract alone "
                             "(none), and the approach (outline, the default), and each step "
                             "(steps)")
    parser.add_argument("--per-item", action="store_true",
                        help="with --self-check: also grade the handout with each item's regions "
                             "alone, which must earn exactly that item")
    args = parser.parse_args(argv)
    try:
        build.check_out_dir(args.out_dir, args.force)
        handout = build.make(os.path.abspath(args.source), args.hints)
        build.write(handout, args.out_dir, args.force)
    except (build.BuildError, regions.MarkerError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    files = sorted({region.path for region in handout.regions})
    print(f"wrote {os.path.join(args.out_dir, 'student')}: {len(handout.student)} files, "
          f"{len(handout.regions)} solution regions in {len(files)} files replaced by prompts "
          f"(hints: {args.hints})")
    print(f"wrote {os.path.join(args.out_dir, 'autograder')} and autograder.zip: "
          f"{len(handout.autograder)} files" + ("" if "grade.py" in handout.autograder
                                                else " (no grade.py yet: it will not grade)"))
    if args.self_check:
        return self_check.self_check(os.path.abspath(args.source), handout, args.out_dir,
                                     per_item=args.per_item)
    return 0


if __name__ == "__main__":
    sys.exit(main())
