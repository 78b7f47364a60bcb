"""``python -m bertknn_search``: the same CLI as ``bertknn-search``."""

from bertknn_search.cli import main

if __name__ == "__main__":
    main()
