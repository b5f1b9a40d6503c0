"""Fair shares of a worker (docs/design.md §9): fair.py what one tenant and one key may hold of a total, cpu.py
each tenant's share of the worker's CPU, searches.py the search slots, admission.py who may take a thread now
(asked by the slow-client guard, service/guard/), answers.py the threads that write large answers. (The per-key
rate limit: service/ratelimit.py.)
"""
