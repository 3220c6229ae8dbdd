"""Report package: Markdown and HTML reports with matplotlib plots, built from `agg` summaries."""
