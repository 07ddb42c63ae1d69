"""Cluster set-up: HCCL rank tables (typed models with every documented rule, generation, merging).

Diagnosing a failed job lives in ``porting.diagnostics``; describing the cluster a job runs on lives
here, because `port train`, `port ranktable` and `port doctor --cluster` all need it before step 1.
"""
