"""Stage 5, deploy: the Kubernetes Helm chart (trt-spec deploy k8s)."""
