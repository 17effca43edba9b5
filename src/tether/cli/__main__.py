"""``python -m tether.cli`` runs the CLI, as ``python -m tether`` does."""

from tether.cli import main

if __name__ == "__main__":
    main()
