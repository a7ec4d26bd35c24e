"""The machine: what the CPU offers (ISA flags, oneDNN) and the compute precision that fits it,
measured by probes and cached; the private network namespace a local cluster's tasks share."""
