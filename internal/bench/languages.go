package bench

import (
	"context"
	"fmt"
	"os/exec"
	"strings"
	"time"
)

// Hello is a language's hello world for the bench, and how `docker exec`
// compiles and runs the same program as its runner does.
type Hello struct {
	Language string
	Compiled bool
	// Code prints hello and the number n, which makes each program
	// distinct (a compiled language then builds each one).
	Code func(n int) string
	File string // the program's file name for Exec
	Exec string // shell command that compiles and runs File in its folder
}

func format(f string) func(int) string { return func(n int) string { return fmt.Sprintf(f, n) } }

// Hellos are the languages of the runners beyond Python, TypeScript and
// bash, with the commands their images run (runners/<language>).
var Hellos = []Hello{
	{Language: "javascript", Code: format("console.log('hello %d')"), File: "main.cjs", Exec: "node main.cjs"},
	{Language: "r", Code: format(`cat("hello %d\n")`), File: "main.R", Exec: "Rscript --vanilla main.R"},
	{Language: "sql", Code: format("SELECT 'hello %d';"), File: "main.sql", Exec: `sqlite3 -bail -batch :memory: ".read main.sql"`},
	{Language: "ruby", Code: format(`puts "hello %d"`), File: "main.rb", Exec: "ruby main.rb"},
	{Language: "php", Code: format(`<?php echo "hello %d\n";`), File: "main.php", Exec: "php main.php"},
	{Language: "go", Compiled: true, Code: format("package main\n\nimport \"fmt\"\n\nfunc main() { fmt.Println(\"hello %d\") }\n"),
		File: "main.go", Exec: "go build -o main main.go && ./main"},
	{Language: "rust", Compiled: true, Code: format("fn main() { println!(\"hello %d\"); }\n"),
		File: "main.rs", Exec: "rustc --edition=2021 -C opt-level=2 -o main main.rs && ./main"},
	{Language: "java", Compiled: true, Code: format("public class Hello {\n    public static void main(String[] args) {\n        System.out.println(\"hello %d\");\n    }\n}\n"),
		File: "main.java", Exec: "/opt/runbox/javac-main main.java out && /opt/runbox/java-main out"},
	{Language: "c", Compiled: true, Code: format("#include <stdio.h>\n\nint main(void) {\n    puts(\"hello %d\");\n    return 0;\n}\n"),
		File: "main.c", Exec: "gcc -O2 -Wall -Wextra -std=gnu17 -o main main.c -lm && ./main"},
	{Language: "cpp", Compiled: true, Code: format("#include <iostream>\n\nint main() {\n    std::cout << \"hello %d\" << std::endl;\n}\n"),
		File: "main.cpp", Exec: "g++ -O2 -Wall -Wextra -std=gnu++20 -o main main.cpp && ./main"},
}

// StartExecContainer starts image idling, as its runner's sandbox would
// be set up for programs (user 1000, read-only root, /tmp and the exec
// tmpfs, the default limits of a sandbox: one CPU, 512 MB, 128 processes),
// for `docker exec` baselines.
func StartExecContainer(ctx context.Context, image string) (*Container, error) {
	out, err := exec.CommandContext(ctx, "docker", "run", "-d", "--network", "none", "--user", "1000:1000", "--read-only",
		"--cpus", "1", "--memory", "512m", "--memory-swap", "512m", "--pids-limit", "128",
		"--tmpfs", "/tmp:rw,nosuid,nodev,noexec,size=64m", "--tmpfs", "/run/runbox:rw,nosuid,nodev,exec,size=128m,uid=1000,gid=1000",
		"-w", "/run/runbox", "--entrypoint", "sleep", image, "infinity").Output()
	if err != nil {
		return nil, fmt.Errorf("docker run -d %s: %w", image, err)
	}
	return &Container{ID: strings.TrimSpace(string(out))}, nil
}

// ExecHello times `docker exec` of h's program n in the container: the
// file written, compiled and run, in one exec.
func (c *Container) ExecHello(ctx context.Context, h Hello, n int) (time.Duration, error) {
	script := fmt.Sprintf(`rm -rf main out; printf %%s "$1" > %s && %s`, h.File, h.Exec)
	t := time.Now()
	out, err := exec.CommandContext(ctx, "docker", "exec", c.ID, "sh", "-c", script, "sh", h.Code(n)).CombinedOutput()
	if err != nil {
		return 0, fmt.Errorf("docker exec %s: %w: %s", h.Language, err, out)
	}
	if want := fmt.Sprintf("hello %d\n", n); !strings.HasSuffix(string(out), want) {
		return 0, fmt.Errorf("docker exec %s: output %q", h.Language, out)
	}
	return time.Since(t), nil
}
