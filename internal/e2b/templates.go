package e2b

import (
	"fmt"
	"strings"

	"github.com/runbox-dev/runbox"
)

// A template is what a sandbox's daemon runs on: E2B's "base" is the
// shell runner's box (bash, Python with the data stack, Node.js, git);
// "code-interpreter-v1" is the same box with E2B's code interpreter,
// whose cells run in the conversation's kept Python interpreter; any
// other template is a runner named by its language. The daemon
// (runbox-envd, in every runner image) is started by a program in the
// runner's language that becomes it, or waits for it.

// Ports of a sandbox E2B's SDKs reach.
const (
	envdPort        = 49983
	interpreterPort = 49999
)

// envdCommand is how the daemon is started inside the sandbox.
const envdCommand = "/opt/runbox/envd"

// template is a template's runner and whether it serves the interpreter.
type template struct {
	language    string
	interpreter bool
}

// templateOf returns what a template id stands for; false when it is
// none.
func templateOf(id string) (template, bool) {
	switch id {
	case "base", "":
		return template{language: "shell"}, true
	case "code-interpreter-v1", "code-interpreter":
		return template{language: "shell", interpreter: true}, true
	}
	if _, ok := launchers[id]; ok {
		return template{language: id}, true
	}
	return template{}, false
}

// launchers start the daemon, in each runner's language: by becoming it
// where the language can exec, else as its child, waited for.
var launchers = map[string]string{
	"shell":      "exec " + envdCommand + "\n",
	"bash":       "exec " + envdCommand + "\n",
	"python":     "import os\nos.execv(" + quote(envdCommand) + ", [" + quote(envdCommand) + "])\n",
	"javascript": "const r = require('child_process').spawnSync(" + quote(envdCommand) + ", [], {stdio: 'inherit'});\nprocess.exit(r.status ?? 1);\n",
	"typescript": "const r = require('child_process').spawnSync(" + quote(envdCommand) + ", [], {stdio: 'inherit'});\nprocess.exit(r.status ?? 1);\n",
	"ruby":       "exec(" + quote(envdCommand) + ")\n",
	"r":          "quit(status = system2(" + quote(envdCommand) + "))\n",
	"php":        "<?php\npassthru(" + quote(envdCommand) + ", $code);\nexit($code);\n",
	"c":          "#include <unistd.h>\nint main(void) { execl(" + quote(envdCommand) + ", " + quote(envdCommand) + ", (char *)0); return 127; }\n",
	"cpp":        "#include <unistd.h>\nint main() { execl(" + quote(envdCommand) + ", " + quote(envdCommand) + ", (char *)nullptr); return 127; }\n",
	"go":         "package main\n\nimport \"syscall\"\n\nfunc main() { _ = syscall.Exec(" + quote(envdCommand) + ", []string{" + quote(envdCommand) + "}, syscall.Environ()) }\n",
	"rust":       "use std::os::unix::process::CommandExt;\nfn main() { let e = std::process::Command::new(" + quote(envdCommand) + ").exec(); eprintln!(\"{e}\"); std::process::exit(127); }\n",
	"java": "public class Main { public static void main(String[] a) throws Exception {\n" +
		"  System.exit(new ProcessBuilder(" + quote(envdCommand) + ").inheritIO().start().waitFor()); } }\n",
}

// quote writes s as a string literal every launcher's language reads.
func quote(s string) string { return fmt.Sprintf("%q", s) }

// templateError is the answer for a template runbox has no runner for.
func templateError(id string) error {
	names := []string{"base", "code-interpreter-v1"}
	for lang := range launchers {
		names = append(names, lang)
	}
	return runbox.Errorf(runbox.ENotFound, "template '%s' not found; this server offers %s (as its runners allow)",
		clip(id, 64), strings.Join(sorted(names), ", "))
}
