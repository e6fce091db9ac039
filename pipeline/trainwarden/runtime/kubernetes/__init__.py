"""The ``kubernetes`` runtime: one pod per instance, restarts in place inside
the running pods, isolation by cordon and taint (docs/DESIGN.md, "On Kubernetes")."""
