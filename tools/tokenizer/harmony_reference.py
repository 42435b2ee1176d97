#!/usr/bin/env python3
"""gpt-oss's harmony chat template and transformers' renders of it.

The gpt-oss tokenizer package fetched by scripts/fetch-tokenizers.sh has no
chat template: upstream ships it as chat_template.jinja beside the tokenizer.
transformers' source carries the same template in its gpt-oss conversion
script (models/gpt_oss/convert_gpt_oss_weights_to_hf.py, the string
`chat_template` of write_tokenizer, Apache-2.0), which its wheel leaves out.
This script takes the template from --template (the committed
testdata/tokenizer/chat/gptoss_chat_template.jinja, transcribed from that
script), or else from the installed transformers when it has the script
(parsing the file: importing it needs tiktoken), then renders the
conversations of testdata/tokenizer/chat_conversations.json followed by
those of chat_conversations_harmony.json through transformers' own
chat-template renderer (jinja2 as apply_chat_template sets it up), and
writes

  OUT/chat/gptoss_chat_template.jinja   the template, byte for byte
  OUT/chat/gptoss.json                  {"method", "source", "date",
                                         "renders": [{"name", "text"} or
                                         {"name", "error"}, ...]}

for engine/tokenizer's TestChatTemplateParityGptOss. The template writes the
day's date ("Current date: YYYY-MM-DD"); the test compares with the date
masked on both sides.

Usage (a machine with transformers; no GPU or tokenizer files needed):
  harmony_reference.py --testdata testdata/tokenizer --out DIR \
      [--template testdata/tokenizer/chat/gptoss_chat_template.jinja]
"""
import argparse
import ast
import datetime
import json
import os
import sys


def template_from_transformers():
    import transformers
    path = os.path.join(os.path.dirname(transformers.__file__), "models", "gpt_oss",
                        "convert_gpt_oss_weights_to_hf.py")
    with open(path, encoding="utf-8") as f:
        tree = ast.parse(f.read(), path)
    for fn in ast.walk(tree):
        if isinstance(fn, ast.FunctionDef) and fn.name == "write_tokenizer":
            for node in ast.walk(fn):
                if (isinstance(node, ast.Assign) and len(node.targets) == 1
                        and isinstance(node.targets[0], ast.Name) and node.targets[0].id == "chat_template"
                        and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str)):
                    return node.value.value, "transformers %s: %s" % (
                        transformers.__version__, os.path.relpath(path, os.path.dirname(transformers.__file__)))
    raise RuntimeError("%s: no string chat_template in write_tokenizer" % path)


def renderer(template):
    """A function (messages, tools, add_generation_prompt, kwargs) -> text,
    with transformers' jinja environment, and how it was built."""
    from transformers.utils import chat_template_utils as ctu
    if hasattr(ctu, "render_jinja_template"):
        def render(messages, tools, gen, kwargs):
            out, _ = ctu.render_jinja_template(conversations=[messages], tools=tools, chat_template=template,
                                               add_generation_prompt=gen, **kwargs)
            return out[0]
        return render, "transformers.utils.chat_template_utils.render_jinja_template"
    compiled = ctu._compile_jinja_template(template)

    def render(messages, tools, gen, kwargs):
        return compiled.render(messages=messages, tools=tools, add_generation_prompt=gen, **kwargs)
    return render, "transformers.utils.chat_template_utils._compile_jinja_template"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--testdata", required=True, help="testdata/tokenizer")
    ap.add_argument("--out", required=True)
    ap.add_argument("--template", help="the template file (default: from the installed transformers' source)")
    a = ap.parse_args()
    if a.template:
        with open(a.template, encoding="utf-8", newline="") as f:
            template = f.read()
        source = "file %s" % os.path.basename(a.template)
    else:
        template, source = template_from_transformers()
    import transformers
    render, method = renderer(template)
    method += " (transformers %s)" % transformers.__version__
    convs = []
    for name in ("chat_conversations.json", "chat_conversations_harmony.json"):
        with open(os.path.join(a.testdata, name), encoding="utf-8") as f:
            convs += json.load(f)
    rows = []
    for c in convs:
        msgs = []
        for m in c["messages"]:
            d = {"role": m["role"], "content": m["content"]}
            d.update(m.get("fields", {}))
            msgs.append(d)
        try:
            text = render(msgs, c.get("tools"), c["add_generation_prompt"], dict(c.get("kwargs", {})))
            rows.append({"name": c["name"], "text": text})
        except Exception as e:  # noqa: BLE001 - the template rejects some conversations on purpose
            rows.append({"name": c["name"], "error": repr(e)})
    d = os.path.join(a.out, "chat")
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "gptoss_chat_template.jinja"), "w", encoding="utf-8", newline="") as f:
        f.write(template)
    with open(os.path.join(d, "gptoss.json"), "w", encoding="utf-8") as f:
        json.dump({"method": method, "source": source, "date": datetime.date.today().isoformat(), "renders": rows},
                  f, ensure_ascii=False, indent=1)
    errors = sum(1 for r in rows if "error" in r)
    print("harmony: %d conversations, %d rejected by the template (%s; %s)" % (len(rows), errors, source, method))
    for r in rows:
        if "error" in r:
            print("  %s: %s" % (r["name"], r["error"][:160]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
