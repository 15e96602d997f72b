"""Stage 5, deploy: Helm chart, Dynamo and trtllm-serve bundles."""
