"""The one error model loading raises: which file is wrong and what is wrong with it."""

from __future__ import annotations

from pathlib import Path


class CheckpointError(Exception):
    """A checkpoint directory or file cannot be used. `path` is the file (or directory) concerned,
    `problem` says what is wrong in words a person can act on; str() is "<path>: <problem>"."""

    def __init__(self, path: str | Path, problem: str) -> None:
        super().__init__(f"{path}: {problem}")
        self.path = Path(path)
        self.problem = problem

    def __reduce__(self) -> tuple[type[CheckpointError], tuple[Path, str]]:
        # Exceptions pickle their args by default; ours has two constructor args, not the message.
        return (type(self), (self.path, self.problem))


class NoChatTemplateError(Exception):
    """The model has no usable chat template, so it cannot serve Chat (FAILED_PRECONDITION): the
    caller should send a plain prompt to Generate or pick a chat model."""


class ChatTemplateError(ValueError):
    """The chat template refused these messages (INVALID_ARGUMENT on `messages`), e.g. roles that do
    not alternate as the model expects."""
