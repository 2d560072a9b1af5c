"""The web app (`python -m launch.app`): Train, Watch, Evaluate and Try from a browser.

`ui.py` is the Gradio page, the only module that imports Gradio; `runs.py` starts, stops and
reads runs; `drivers.py` tells whether a run's driver process lives; `model_tabs.py` is the
Evaluate and Try tabs' work; `policy.py` is what a page may do (the server's flags);
`login.py` the login check and its rate limit; `uploads.py` the datasets the Train tab offers.
"""
