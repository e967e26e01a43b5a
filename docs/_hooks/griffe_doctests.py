"""Griffe extension for the API reference: the package's docstrings give examples as bare
doctest lines (``>>> ...`` and the output after them, up to a blank line), which Markdown
would run together into one paragraph (and read ``[1, 2][:1]`` as a link). Each such run of
lines is fenced as a ``pycon`` code block, indented as its first line is."""
import griffe


class DoctestFences(griffe.Extension):
    def on_object(self, *, obj, **kwargs):
        if obj.docstring is not None:
            obj.docstring.value = fence_doctests(obj.docstring.value)


def fence_doctests(text):
    out, in_example = [], False
    for line in text.split("\n"):
        stripped = line.lstrip()
        if not in_example and stripped.startswith(">>>"):
            indent = line[:len(line) - len(stripped)]
            out.append(f"{indent}```pycon")
            in_example = True
        elif in_example and not stripped:
            out.append(f"{indent}```")
            in_example = False
        out.append(line)
    if in_example:
        out.append(f"{indent}```")
    return "\n".join(out)
