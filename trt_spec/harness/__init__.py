"""Client-side harness: prompt sets, metrics, identity checks, benchmarks and reports."""
