"""`python -m api.crds [--check]`: (re)generate the CRD YAML, or fail when it is stale."""

import argparse
import sys

from api.crds import generated_files, stale_files


def main(argv: list[str] | None = None) -> int:
    """Write the CRD files; with --check only report stale ones (exit 1)."""
    parser = argparse.ArgumentParser(prog="python -m api.crds", description=__doc__)
    parser.add_argument("--check", action="store_true", help="do not write; exit 1 if a file is stale")
    args = parser.parse_args(argv)
    if args.check:
        stale = stale_files()
        for path in stale:
            print(f"stale: {path} (run `python -m api.crds`)", file=sys.stderr)
        return 1 if stale else 0
    for path, text in generated_files().items():
        path.write_text(text)
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
