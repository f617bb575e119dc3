"""Everything that imports IPython or ipywidgets lives here, and only here."""
