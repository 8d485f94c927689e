def __runbox_e2b_cell(src, context, env, cwd, nonce):
    # One cell of E2B's code interpreter, run in the conversation's kept
    # interpreter by runbox: its own context's namespace (the default
    # context is the interpreter's own), its environment variables and
    # working directory for the cell only; its result, its error and its
    # count written to stdout as lines runbox reads (the nonce marks them).
    # As in E2B's notebooks, the cell may be indented as a whole, its
    # !lines are shell commands, and the working directory is named as the
    # sandbox's home, /home/user, rather than /data, where it leads.
    import ast, base64, builtins, json, os, re, subprocess, sys, textwrap, traceback

    main = globals()

    def emit(obj):
        sys.stdout.flush()
        sys.stderr.flush()
        sys.stdout.write("\x1eRBX" + nonce + ":" + json.dumps(obj) + "\n")
        sys.stdout.flush()

    real_getcwd = os.getcwd

    def getcwd():
        d = real_getcwd()
        return "/home/user" + d[len("/data"):] if d == "/data" or d.startswith("/data/") else d

    def shell(command):
        sys.stdout.flush()
        sys.stderr.flush()
        env = dict(os.environ, PWD=getcwd())
        p = subprocess.run(command, shell=True, executable="/bin/bash", env=env, stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT)
        sys.stdout.write(p.stdout.decode(errors="replace"))

    def with_shell(code):
        # `!cmd` lines become calls of shell(), indented as they were.
        return re.sub(r"(?m)^([ \t]*)!(.*)$", lambda m: m.group(1) + "__runbox_e2b_shell(" + repr(m.group(2)) + ")", code)

    def data_of(value):
        pd = sys.modules.get("pan" + "das")
        if pd is None or not isinstance(value, pd.DataFrame):
            return None
        out = value.to_dict(orient="list")
        return json.loads(json.dumps({k: [v.isoformat() if isinstance(v, pd.Timestamp) else v for v in vs]
                                      for k, vs in out.items()}, default=str))

    def text_of(value):
        text = repr(value)
        if len(text) >= 2 and text[0] == text[-1] and text[0] in "'\"":
            text = text[1:-1]
        return text

    def formats(value):
        out = {"text": text_of(value)}
        data = data_of(value)
        if data is not None:
            out["data"] = data
        for attr, key in (("_repr_html_", "html"), ("_repr_markdown_", "markdown"), ("_repr_svg_", "svg"),
                          ("_repr_png_", "png"), ("_repr_jpeg_", "jpeg"), ("_repr_latex_", "latex"),
                          ("_repr_json_", "json"), ("_repr_javascript_", "javascript")):
            try:
                f = getattr(value, attr, None)
                data = f() if callable(f) and not isinstance(value, type) else None
            except Exception:
                data = None
            if data is None:
                continue
            if isinstance(data, tuple):
                data = data[0]
            if isinstance(data, bytes):
                data = base64.b64encode(data).decode()
            out[key] = data
        if type(value).__name__ == "Figure" and hasattr(value, "savefig"):
            out["png"] = figure_png(value)
        return out

    def figure_png(fig):
        import io
        buf = io.BytesIO()
        fig.savefig(buf, format="png", bbox_inches="tight")
        return base64.b64encode(buf.getvalue()).decode()

    def figures():
        # Named in two halves: the word whole would have the zygote preload
        # the data stack for every cell (the agent's -preload-when).
        plt = sys.modules.get("matplot" + "lib.pyplot")
        if plt is None:
            return
        for num in plt.get_fignums():
            fig = plt.figure(num)
            emit({"type": "result", "text": repr(fig), "png": figure_png(fig), "is_main_result": False})
        plt.close("all")

    if context in (None, "", "default"):
        ns = main
    else:
        ns = main.setdefault("_e2b_contexts", {}).setdefault(
            context, {"__name__": "__main__", "__builtins__": builtins})
    counts = main.setdefault("_e2b_counts", {})
    count = counts.get(context or "default", 0) + 1
    counts[context or "default"] = count
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    here = real_getcwd()
    os.getcwd = getcwd
    builtins.__runbox_e2b_shell = shell
    # plt.show() shows its figures as the cell's results (runbox_inline).
    builtins.__runbox_show__ = lambda fig: emit(
        {"type": "result", "text": repr(fig), "png": figure_png(fig), "is_main_result": False})
    try:
        if cwd:
            os.chdir(cwd)
        tree = ast.parse(with_shell(textwrap.dedent(src)), "<cell>")
        last = None
        if tree.body and isinstance(tree.body[-1], ast.Expr):
            last = ast.Expression(tree.body.pop().value)
        exec(compile(tree, "<cell>", "exec"), ns)
        value = eval(compile(last, "<cell>", "eval"), ns) if last is not None else None
        figures()
        if value is not None:
            emit(dict(formats(value), type="result", is_main_result=True))
    except BaseException as e:
        tb = e.__traceback__
        while tb is not None and tb.tb_frame.f_code.co_filename != "<cell>":
            tb = tb.tb_next
        emit({"type": "error", "name": type(e).__name__, "value": str(e),
              "traceback": "".join(traceback.format_exception(type(e), e, tb))})
    finally:
        del builtins.__runbox_show__
        del builtins.__runbox_e2b_shell
        os.getcwd = real_getcwd
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        try:
            os.chdir(here)
        except OSError:
            pass
        emit({"type": "number_of_executions", "execution_count": count})
