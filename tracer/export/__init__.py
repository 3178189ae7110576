"""Take a trace out of the terminal: a Perfetto timeline (perfetto.py) and a one-file browser
replay built from the replay TUI's own frames (frames.py, frame_pack.py, html.py)."""
