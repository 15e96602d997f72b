"""What every stage reads: the config schema, the build manifest and repository record, names, defaults, the
tensorrtllm backend's contract, speculation's vocabulary and maths, the draft-length policy (both loops'), integrity
sums, atomic writes."""
