"""Slow clients cannot hold gunicorn's worker threads (docs/design.md §9): worker.py the gunicorn worker that does
the rest, arrival.py the requests, responses.py the responses (and the guard's bounds), parking.py the requests that
must wait for a thread (their key's share, a search slot, their tenant's CPU share) without holding one.

gthread hands a connection to a worker thread as soon as it is readable, and the thread then reads
the request with blocking ``recv`` calls and writes the response with blocking ``sendall``. A client
that sends one header line every few seconds (slowloris), trickles a body, or reads its answer
4 KiB at a time therefore held a thread for as long as it liked; 20 of them starved /healthz.
service/gunicorn_conf.py names ``worker.GuardedWorker`` as its ``worker_class``:

- **A request arrives without a thread** (service/guard/arrival.py): its head and its body, whatever
  the framing (Content-Length, chunked, after "100 Continue"), are buffered as they come, and the
  thread gets the whole request at once.
- **Authentication before the body.** A request with a body whose Authorization header names no
  configured key is handed over without it (and without "100 Continue"): the app answers 401 in its
  door's shape before reading a byte of it, and the connection closes. So does a body over the
  route's limit (413).
- **Total deadline.** Headers and body arrive within ``request_deadline_s`` of the first byte, or the
  client gets a JSON 408 and the connection is closed.
- **Responses** (service/guard/responses.py): a client slower than the server has the rest of its
  response written by the worker's poller, not a thread; a thread that does wait on a client (a
  response over 8 MiB, a body not buffered) waits under a ``Pace``: ``slow_client_grace_s`` in all
  beyond what the client's pace pays for at ``min_send_rate`` / ``min_receive_rate``. Every response
  is written within ``write_deadline_s`` of its first byte. A client past a bound is reset. A live
  stream (service/hub.py) sets its own socket timeout, which bounds it instead.
- Connections close without lingering on the worker's main thread; a dropped slow client is a
  debug line, not a traceback; gunicorn's own 400/414/431 answers are JSON in the REST error shape.
"""
