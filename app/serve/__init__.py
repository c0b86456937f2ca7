"""``serve``: the supervisor of Triton, the router and NGINX, and its helpers."""
