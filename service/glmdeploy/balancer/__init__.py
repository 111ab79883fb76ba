"""The load balancer's own services (roles/load_balancer): health checks and API keys; run there as
standalone files.
"""
