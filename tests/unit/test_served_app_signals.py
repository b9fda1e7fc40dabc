"""A served app leaves the process's signals to their owner (`fullasync.gateway.http.ServedApp`): one SIGTERM while
the gateway serves reaches the run's handler once, and the gateway goes on serving (uvicorn's own capture once
stopped it at once and raised the signal a second time, so a run stopped without its checkpoint)."""

from __future__ import annotations

import asyncio
import os
import signal

import httpx

from fullasync.gateway.http import ServedApp


async def app(scope, receive, send) -> None:
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/plain")]})
    await send({"type": "http.response.body", "body": b"serving"})


def test_one_sigterm_while_serving_reaches_the_owner_once_and_the_app_goes_on_serving():
    async def main():
        loop = asyncio.get_running_loop()
        heard: list[int] = []
        loop.add_signal_handler(signal.SIGTERM, heard.append, signal.SIGTERM)
        served = ServedApp(app, "test-app")
        try:
            await served.start()
            os.kill(os.getpid(), signal.SIGTERM)
            await asyncio.sleep(0.5)  # the signal's handler runs at the loop's next turn; a re-raise would follow
            async with httpx.AsyncClient(timeout=10) as http:
                answer = await http.get(served.url)
            await served.stop()
            await asyncio.sleep(0.2)  # uvicorn re-raised what it captured when it stopped
        finally:
            loop.remove_signal_handler(signal.SIGTERM)
        return heard, answer.status_code, answer.text

    heard, status, text = asyncio.run(main())
    assert heard == [signal.SIGTERM]  # once
    assert (status, text) == (200, "serving")
