"""mkdocs hook: `{{ config_reference }}` in a page becomes the reference generated from the typed schemas."""

from trainer.config.reference import markdown

MARKER = "{{ config_reference }}"


def on_page_markdown(text: str, page, config, files) -> str:
    return text.replace(MARKER, markdown()) if MARKER in text else text
