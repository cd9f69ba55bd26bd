"""GPU stage: build candidates with nvcc, evaluate and profile them in a worker process."""
