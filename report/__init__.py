"""The run report: figures and tables from a recipe's artifacts, as HTML and markdown."""
