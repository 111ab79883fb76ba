"""What the monitoring host scrapes on each node (roles/node_metrics): the generation prober and
the GPU exporter.
"""
