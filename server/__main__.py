from __future__ import annotations

from server.cli import main

if __name__ == "__main__":
    main()
