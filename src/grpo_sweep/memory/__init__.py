"""The memory model: pure arithmetic, no torch. The estimator (peak bytes per component), the
throughput model, OOM-message parsing and the doctor that turns an OOM into overrides that fit."""
