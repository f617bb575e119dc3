"""Everything that imports IPython or ipywidgets lives here, and only here:
the cell magic, the control panel and their live views."""
