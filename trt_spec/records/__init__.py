"""What every stage reads: config schema, manifests, names, defaults, the backend contract, speculation, integrity."""
