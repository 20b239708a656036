"""Tasks of the test project: each leaves a trace the tests can see."""

from pathlib import Path

from django.tasks import task


@task
def record(path: str, text: str) -> str:
    Path(path).write_text(text)
    return text


@task(priority=10, queue_name="emails")
def send_email(path: str, to: str) -> None:
    Path(path).write_text(f"to {to}")


@task
def explode(message: str) -> None:
    raise ValueError(message)


@task(takes_context=True)
def attempt_of(context, path: str) -> None:
    Path(path).write_text(f"{context.task_result.id} attempt {context.attempt}")


@task
def flaky(path: str) -> None:
    """Fails its first attempt (leaving a mark), succeeds on the retry."""
    mark = Path(path + ".tried")
    if not mark.exists():
        mark.write_text("1")
        raise RuntimeError("first attempt fails")
    Path(path).write_text("second attempt")
