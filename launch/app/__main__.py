"""`python -m launch.app`: serve the web app (launch/app/ui.py; `make app` installs Gradio)."""

import sys

from launch.app.ui import main

if __name__ == "__main__":
    sys.exit(main())
