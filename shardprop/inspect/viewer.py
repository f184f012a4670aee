"""``sp.visualize(prog)``: Model Explorer's local server on a program's shard graph (``inspect/model_explorer.py``
draws it), run as a subprocess so that it can be stopped; the ``Viewer`` it returns holds its URL."""

from __future__ import annotations

import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
import webbrowser
from pathlib import Path
from typing import Any

from ..errors import OptionError, RenderError
from ..extras import require
from .model_explorer import model_explorer_json, model_explorer_overlays, to_model_explorer


class Viewer:
    """A running Model Explorer server showing one program (what ``visualize`` returns): open ``url`` in a
    browser; ``stop()`` ends the server (also on leaving a ``with`` block)."""

    def __init__(self, process: subprocess.Popen, url: str, directory: Path):
        self.process, self.url, self.directory = process, url, directory

    def stop(self) -> None:
        """End the server (the files it served stay in ``directory``)."""
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()

    def wait(self) -> None:
        """Serve until the server ends or Ctrl+C, then stop it."""
        try:
            self.process.wait()
        except KeyboardInterrupt:
            pass
        finally:
            self.stop()

    def __enter__(self) -> Viewer:
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def __repr__(self) -> str:
        state = "running" if self.process.poll() is None else "stopped"
        return f"<Viewer {state} at {self.url}>"


def save_model_explorer(prog: Any, directory: str | Path) -> tuple[Path, list[Path]]:
    """Write ``graph.json`` (``to_model_explorer``) and one node-data file per overlay
    (``model_explorer_overlays``: ``bytes-moved.json``, ``layout.json``) into ``directory``; returns their paths,
    which ``model-explorer graph.json --node_data_paths bytes-moved.json,layout.json`` opens."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    graph = directory / "graph.json"
    graph.write_text(model_explorer_json(to_model_explorer(prog)))
    overlays = []
    for name, data in model_explorer_overlays(prog).items():
        path = directory / f"{name.replace(' ', '-')}.json"
        path.write_text(data.to_json_string())
        overlays.append(path)
    return graph, overlays


def visualize(prog: Any, *, host: str = "localhost", port: int | None = None, open_browser: bool = True,
              block: bool = True, directory: str | Path | None = None, timeout: float = 60.0) -> Viewer:
    """Show the program's shard graph in Model Explorer: start its local server (a subprocess) on
    ``to_model_explorer(prog)`` with the overlays of ``model_explorer_overlays`` and open the page in the browser.

    ``port`` None picks a free one. With ``block`` (the default) it serves until Ctrl+C; with ``block=False`` it
    returns the running ``Viewer`` at once (its ``url``; ``stop()`` ends it). The files served are written to
    ``directory`` (a new temporary one by default). Needs the ``viewer`` extra
    (``shardprop.ExtraNotInstalledError`` otherwise).

    Examples:
        >>> mesh = sp.make_mesh((4, 2), ("i", "j"))
        >>> def f(a, b):                                   # the Nx design note's example
        ...     x, y = a + b, a - b
        ...     return jnp.sum(x, axis=1)[:, None] + jnp.sum(y, axis=0)[None, :]
        >>> a, b = jnp.arange(128.0).reshape(16, 8), jnp.ones((16, 8))
        >>> prog = sp.autoshard(f, mesh=mesh, in_specs=(P("i", "j"), None), strategy="gather").trace(a, b)
        >>> viewer = sp.visualize(prog, open_browser=False, block=False)
        >>> viewer.url                                                  # doctest: +ELLIPSIS
        'http://localhost:.../?data=...'
        >>> viewer.stop()
    """
    require("model_explorer", extra="viewer")
    from model_explorer.config import ModelExplorerConfig

    if port is not None and not (isinstance(port, int) and 0 < port < 65536):
        raise OptionError(f"port={port!r}: expected a TCP port, 1 to 65535 (or None to pick a free one)")
    try:
        socket.getaddrinfo(host, None, socket.AF_INET)
    except OSError as err:
        raise OptionError(f"host={host!r}: not an IPv4 name or address this machine resolves ({err})") from None
    port = _free_port(host) if port is None else port
    if _in_use(host, port):
        raise OptionError(f"port {port} on {host} is in use: pass another port=, or port=None to pick a free one")
    folder = Path(directory) if directory is not None else Path(tempfile.mkdtemp(prefix="shardprop-viewer-"))
    graph, overlays = save_model_explorer(prog, folder)
    command = [sys.executable, "-m", "model_explorer", str(graph), "--host", host, "--port", str(port),
               "--no_open_in_browser", "--node_data_paths", ",".join(map(str, overlays))]
    with open(folder / "server.log", "w") as log:  # the child holds its own copy of the descriptor
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    viewer = Viewer(process, f"http://{host}:{port}/", folder)
    try:  # whatever stops the start (Ctrl+C, a config error), the server does not outlive it
        config = ModelExplorerConfig().add_model_from_path(str(graph))
        for path in overlays:
            config.add_node_data_from_path(str(path))
        viewer.url = f"http://{host}:{port}/?data={config.to_url_param_value()}"
        deadline = time.monotonic() + timeout
        while not _healthy(host, port):
            if process.poll() is not None or time.monotonic() > deadline:
                raise RenderError(f"Model Explorer's server did not start on {host}:{port}: "
                                  f"{(folder / 'server.log').read_text().strip()[-500:]}")
            time.sleep(0.1)
    except BaseException:
        viewer.stop()
        raise
    if open_browser:
        webbrowser.open_new_tab(viewer.url)
    if block:
        print(f"Model Explorer is showing the shard graph at {viewer.url} (Ctrl+C stops it)")
        viewer.wait()
    return viewer


def _free_port(host: str) -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def _in_use(host: str, port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex((host, port)) == 0


def _healthy(host: str, port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://{host}:{port}/check_health", timeout=1) as answer:
            return answer.read() == b"model_explorer_ok"
    except OSError:
        return False
