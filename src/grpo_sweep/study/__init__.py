"""The Optuna study, shared by the sweeper (which writes it) and the report (which reads it):
the one storage opener (storage) and the one best-trial rule (best)."""
