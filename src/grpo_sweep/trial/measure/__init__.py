"""Measuring a trial: speed (speed_meter), memory (memory_meter; the CPU tensor tracker in
tracker), and enforcing the target card's budget (enforce)."""
