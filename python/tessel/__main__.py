"""`python -m tessel ...` and the `tessel` script: the same command-line tool as the C++ build."""
import os
import sys


def executable() -> str:
    """The `tessel` executable installed inside the package."""
    return os.path.join(os.path.dirname(os.path.abspath(__file__)), "_bin", "tessel")


def main() -> None:
    exe = executable()
    if not os.access(exe, os.X_OK):
        sys.exit(f"tessel: the command-line tool is missing from the package ({exe}); reinstall tessel")
    os.execv(exe, [exe, *sys.argv[1:]])


if __name__ == "__main__":
    main()
