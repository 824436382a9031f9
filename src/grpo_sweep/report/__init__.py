"""The comparison report: trial records and analysis (trials), figures, the HTML page and the W&B
Report. Reads metrics.json files and studies; never imports the trial side."""
