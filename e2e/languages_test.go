package e2e

import (
	"cmp"
	"encoding/base64"
	"fmt"
	"net/http"
	"strings"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// language is what the table below runs in one language: each program
// does what its name says. Programs that read stdin print it upper-cased;
// out writes "<language>" to /data/out.txt (by a path relative to the
// working directory, /data, for the interpreters started ahead, which
// start in / and move there); loop prints "up", flushed, then never ends.
type language struct {
	name     string
	compiled bool
	hello    string
	// helloErr is in the hello program's stderr (the compiler's warnings).
	helloErr   string
	stdin, out string
	broken     string // a compile or syntax error
	brokenErr  string // in its stderr
	fails      string // a runtime error: failsErr ("boom" if empty) in stderr
	failsCode  int
	failsErr   string
	loop       string
	shell      string // runs the shell command CMD, exit 0 if it did
	extra      func(t *testing.T, cs *mcp.ClientSession, cid string)
}

var languages = []language{
	{name: "javascript",
		hello:  "console.log('hello')",
		stdin:  "const s = require('fs').readFileSync(0, 'utf8');\nconsole.log(s.trim().toUpperCase());",
		out:    "import { writeFileSync } from 'node:fs';\nwriteFileSync('out.txt', 'javascript');",
		broken: "console.log(", brokenErr: "SyntaxError",
		fails: "throw new Error('boom');", failsCode: 1,
		loop:  "console.log('up');\nwhile (true) {}",
		shell: "const r = require('child_process').spawnSync('sh', ['-c', 'CMD'], {stdio: 'inherit'});\nprocess.exit(r.status === 0 ? 0 : 1);",
	},
	{name: "r",
		hello:  `cat("hello\n")`,
		stdin:  `x <- readLines(file("stdin"))` + "\n" + `cat(toupper(x), sep = "\n")`,
		out:    `writeLines("r", "out.txt")`,
		broken: "cat(", brokenErr: "unexpected end of input",
		fails: `stop("boom")`, failsCode: 1,
		loop:  "cat(\"up\\n\"); flush(stdout())\nrepeat {}",
		shell: `quit(status = if (system("CMD") == 0) 0 else 1)`,
		extra: rChart,
	},
	{name: "sql",
		hello:  "SELECT 'hello';",
		stdin:  "CREATE TABLE t(a);\n.import --csv /dev/stdin t\nSELECT upper(a) FROM t;",
		out:    ".once /data/out.txt\nSELECT 'sql';",
		broken: "SELEC 1;", brokenErr: "syntax error",
		fails: "SELECT abs(-9223372036854775807 - 1);", failsCode: 1, failsErr: "integer overflow",
		loop:  ".output /dev/stderr\n.print up\n.output stdout\nWITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c) SELECT count(*) FROM c;",
		shell: ".system CMD",
		extra: sqlCSV,
	},
	{name: "go", compiled: true,
		hello:  "package main\n\nimport \"fmt\"\n\nfunc main() { fmt.Println(\"hello\") }",
		stdin:  "package main\n\nimport (\n\t\"fmt\"\n\t\"io\"\n\t\"os\"\n\t\"strings\"\n)\n\nfunc main() {\n\tb, _ := io.ReadAll(os.Stdin)\n\tfmt.Println(strings.ToUpper(strings.TrimSpace(string(b))))\n}",
		out:    "package main\n\nimport \"os\"\n\nfunc main() { os.WriteFile(\"/data/out.txt\", []byte(\"go\"), 0o644) }",
		broken: "package main\n\nfunc main() { x := 1 }", brokenErr: "declared but not used",
		fails: "package main\n\nfunc main() { panic(\"boom\") }", failsCode: 2,
		loop:  "package main\n\nimport \"fmt\"\n\nfunc main() {\n\tfmt.Println(\"up\")\n\tfor {\n\t}\n}",
		shell: "package main\n\nimport (\n\t\"os\"\n\t\"os/exec\"\n)\n\nfunc main() {\n\tc := exec.Command(\"sh\", \"-c\", \"CMD\")\n\tc.Stdout, c.Stderr = os.Stdout, os.Stderr\n\tif c.Run() != nil {\n\t\tos.Exit(1)\n\t}\n}",
	},
	{name: "rust", compiled: true,
		hello: "fn main() {\n    let unused = 1;\n    println!(\"hello\");\n}", helloErr: "unused variable",
		stdin:  "use std::io::Read;\nfn main() {\n    let mut s = String::new();\n    std::io::stdin().read_to_string(&mut s).unwrap();\n    println!(\"{}\", s.trim().to_uppercase());\n}",
		out:    "fn main() { std::fs::write(\"/data/out.txt\", \"rust\").unwrap(); }",
		broken: "fn main() { let x: i32 = \"a\"; }", brokenErr: "mismatched types",
		fails: "fn main() { panic!(\"boom\"); }", failsCode: 101,
		loop:  "fn main() {\n    println!(\"up\");\n    loop {}\n}",
		shell: "fn main() {\n    let s = std::process::Command::new(\"sh\").arg(\"-c\").arg(\"CMD\").status().unwrap();\n    std::process::exit(if s.success() { 0 } else { 1 });\n}",
	},
	{name: "java", compiled: true,
		// Not Main: the public class is run, whatever its name.
		hello:  "public class Greeter {\n    public static void main(String[] args) {\n        System.out.println(\"hello\");\n    }\n}",
		stdin:  "import java.io.*;\n\npublic class Upper {\n    public static void main(String[] args) throws IOException {\n        String s = new String(System.in.readAllBytes()).trim();\n        System.out.println(s.toUpperCase());\n    }\n}",
		out:    "import java.nio.file.*;\n\nclass Out {\n    public static void main(String[] args) throws Exception {\n        Files.writeString(Path.of(\"/data/out.txt\"), \"java\");\n    }\n}",
		broken: "public class Broken {\n    public static void main(String[] args) {\n        System.out.println(\"x\")\n    }\n}", brokenErr: "';' expected",
		fails: "public class Fails {\n    public static void main(String[] args) {\n        throw new RuntimeException(\"boom\");\n    }\n}", failsCode: 1,
		loop:  "public class Loop {\n    public static void main(String[] args) {\n        System.out.println(\"up\");\n        while (true) {}\n    }\n}",
		shell: "public class Sh {\n    public static void main(String[] args) throws Exception {\n        System.exit(new ProcessBuilder(\"sh\", \"-c\", \"CMD\").inheritIO().start().waitFor() == 0 ? 0 : 1);\n    }\n}",
	},
	{name: "c", compiled: true,
		hello: "#include <stdio.h>\n\nint main(void) {\n    int unused;\n    puts(\"hello\");\n    return 0;\n}", helloErr: "warning: unused variable",
		stdin:  "#include <ctype.h>\n#include <stdio.h>\n\nint main(void) {\n    int c;\n    while ((c = getchar()) != EOF) putchar(toupper(c));\n    return 0;\n}",
		out:    "#include <stdio.h>\n\nint main(void) {\n    FILE *f = fopen(\"/data/out.txt\", \"w\");\n    fputs(\"c\", f);\n    return fclose(f);\n}",
		broken: "int main(void) { return x; }", brokenErr: "undeclared",
		fails: "#include <stdio.h>\n\nint main(void) {\n    fputs(\"boom\\n\", stderr);\n    return 3;\n}", failsCode: 3,
		loop:  "#include <stdio.h>\n\nint main(void) {\n    volatile int x = 0;\n    puts(\"up\");\n    fflush(stdout);\n    for (;;) x++;\n}",
		shell: "#include <stdlib.h>\n\nint main(void) { return system(\"CMD\") == 0 ? 0 : 1; }",
	},
	{name: "cpp", compiled: true,
		hello: "#include <iostream>\n\nint main() {\n    int unused;\n    std::cout << \"hello\" << std::endl;\n}", helloErr: "warning: unused variable",
		stdin:  "#include <algorithm>\n#include <iostream>\n#include <string>\n\nint main() {\n    std::string s;\n    std::getline(std::cin, s);\n    std::transform(s.begin(), s.end(), s.begin(), ::toupper);\n    std::cout << s << '\\n';\n}",
		out:    "#include <fstream>\n\nint main() { std::ofstream(\"/data/out.txt\") << \"cpp\"; }",
		broken: "int main() { return x; }", brokenErr: "was not declared",
		fails: "#include <stdexcept>\n\nint main() { throw std::runtime_error(\"boom\"); }", failsCode: -1,
		loop:  "#include <iostream>\n\nint main() {\n    volatile int x = 0;\n    std::cout << \"up\" << std::endl;\n    for (;;) x++;\n}",
		shell: "#include <cstdlib>\n\nint main() { return std::system(\"CMD\") == 0 ? 0 : 1; }",
	},
	{name: "ruby",
		hello:  `puts "hello"`,
		stdin:  "puts STDIN.read.strip.upcase",
		out:    `File.write("out.txt", "ruby")`,
		broken: "puts(", brokenErr: "syntax error",
		fails: `raise "boom"`, failsCode: 1,
		loop:  "$stdout.sync = true\nputs 'up'\nloop {}",
		shell: `exit(system("sh", "-c", "CMD") ? 0 : 1)`,
	},
	// The commands tools' general-purpose box, as a language of its own.
	{name: "shell",
		hello:  "echo hello",
		stdin:  "tr '[:lower:]' '[:upper:]'",
		out:    "printf shell > out.txt",
		broken: "if then fi", brokenErr: "syntax error",
		fails: "echo boom >&2; exit 4", failsCode: 4,
		loop:  "echo up; while :; do :; done",
		shell: "CMD",
	},
	{name: "php",
		// Without the opening tag: PHP code all the same.
		hello:  `echo "hello\n";`,
		stdin:  "<?php\necho strtoupper(trim(stream_get_contents(STDIN))), \"\\n\";",
		out:    `<?php file_put_contents("out.txt", "php");`,
		broken: "<?php echo (;", brokenErr: "PHP Parse error",
		fails: `<?php throw new Exception("boom");`, failsCode: 255,
		loop:  "<?php\necho \"up\\n\";\nwhile (true) {}",
		shell: `<?php passthru("CMD", $rc); exit($rc == 0 ? 0 : 1);`,
	},
}

// TestLanguages is the acceptance of every runner beyond Python,
// TypeScript and bash: hello world, stdin (given, and sent while the
// program runs), a file in /data that comes back
// as an artifact with a working download URL, a compile or syntax error, a
// runtime error, a timeout and a cancel; R draws a chart that comes back
// as an image, SQL reads a CSV from /data. Languages run in parallel.
func TestLanguages(t *testing.T) {
	s := start(t, options{env: []string{"EXECUTOR_CONCURRENCY=3"}})
	cs := s.session(nil)

	var runners struct {
		Languages []struct{ Language, Image, Version string } `json:"languages"`
	}
	call(t, cs, "list_runners", nil, &runners)
	versions := map[string]string{}
	for _, l := range runners.Languages {
		versions[l.Language] = l.Version
	}
	for _, lang := range languages {
		t.Run(lang.name, func(t *testing.T) {
			t.Parallel()
			if v := versions[lang.name]; v == "" || !strings.ContainsAny(v, "0123456789") {
				t.Errorf("list_runners: version %q", v)
			}
			cid := "lang-" + lang.name
			run := func(code string, extra map[string]any) result {
				t.Helper()
				args := map[string]any{"language": lang.name, "conversationId": cid, "code": code}
				for k, v := range extra {
					args[k] = v
				}
				return runCode(t, cs, args)
			}
			phase := func(p string) string {
				if lang.compiled {
					return p
				}
				return ""
			}

			r := run(lang.hello, nil)
			if r.Stdout != "hello\n" || !r.Success || r.Phase != phase("run") || !strings.Contains(r.Stderr, lang.helloErr) {
				t.Errorf("hello: %+v", r)
			}
			if lang.compiled { // again: from the cache, warnings and all
				if again := run(lang.hello, nil); again.Stdout != r.Stdout || again.Stderr != r.Stderr || !again.Success {
					t.Errorf("hello again: %+v, first %+v", again, r)
				}
			}
			if r = run(lang.stdin, map[string]any{"stdin": "runbox\n"}); r.Stdout != "RUNBOX\n" || !r.Success {
				t.Errorf("stdin: %+v", r)
			}
			// The same with its input sent while it runs.
			st := startRun(t, cs, map[string]any{"language": lang.name, "conversationId": cid, "code": lang.stdin, "interactive": true})
			for _, in := range []map[string]any{{"data": "run"}, {"data": "box\n", "eof": true}} {
				in["run_id"] = st.RunID
				if res := call(t, cs, "send_stdin", in, nil); res.IsError {
					t.Fatalf("send_stdin: %s", text(res))
				}
			}
			if res, _ := waitRun(t, cs, st.RunID); res.Stdout != "RUNBOX\n" || !res.Success {
				t.Errorf("interactive stdin: %+v", res)
			}
			r = run(lang.out, nil)
			if !r.Success || len(r.Artifacts) != 1 || r.Artifacts[0].Name != "out.txt" {
				t.Fatalf("out.txt: %+v", r)
			}
			if code, body := get(t, r.Artifacts[0].URL); code != http.StatusOK || strings.TrimSpace(string(body)) != lang.name {
				t.Errorf("download of out.txt: %d %q", code, body)
			}
			r = run(lang.broken, nil)
			if r.Success || r.ExitCode == 0 || r.Phase != phase("compile") || !strings.Contains(r.Stderr, lang.brokenErr) {
				t.Errorf("broken: %+v", r)
			}
			r = run(lang.fails, nil)
			if r.Success || r.ExitCode != lang.failsCode || r.Phase != phase("run") || !strings.Contains(r.Stderr, cmp.Or(lang.failsErr, "boom")) {
				t.Errorf("runtime error: exit %d phase %q stderr %q, want exit %d", r.ExitCode, r.Phase, r.Stderr, lang.failsCode)
			}
			if lang.extra != nil {
				lang.extra(t, cs, cid)
			}
			if r = run(lang.loop, map[string]any{"timeout_seconds": 5}); !r.TimedOut || r.Success {
				t.Errorf("timeout: %+v", r)
			}

			// Cancelled once it runs (its output published).
			st = startRun(t, cs, map[string]any{"language": lang.name, "conversationId": cid, "code": lang.loop})
			waitFor(t, func() bool {
				var p progress
				call(t, cs, "get_run", map[string]any{"run_id": st.RunID}, &p)
				for _, ev := range p.Events {
					if (ev.Type == "stdout" || ev.Type == "stderr") && strings.Contains(ev.Data, "up") {
						return true
					}
				}
				return false
			})
			var c struct{ Status string }
			if res := call(t, cs, "cancel_run", map[string]any{"run_id": st.RunID}, &c); res.IsError || c.Status != "cancelled" {
				t.Fatalf("cancel: %s", text(res))
			}
			if res, _ := waitRun(t, cs, st.RunID); !res.Cancelled || res.Success {
				t.Errorf("cancelled run: %+v", res)
			}
			// The conversation goes on.
			if r = run(lang.hello, nil); r.Stdout != "hello\n" {
				t.Errorf("hello after the cancel: %+v", r)
			}
		})
	}
}

// rChart: a ggplot2 chart saved to /data is an artifact, and comes back to
// the model as an image.
func rChart(t *testing.T, cs *mcp.ClientSession, cid string) {
	var r result
	res := call(t, cs, "run_code", map[string]any{"language": "r", "conversationId": cid, "code": `library(ggplot2)
p <- ggplot(mtcars, aes(wt, mpg)) + geom_point()
ggsave("/data/chart.png", p, width = 4, height = 3, dpi = 72)
png("/data/base.png"); plot(1:10); invisible(dev.off())`}, &r)
	if !r.Success || len(r.Artifacts) != 2 {
		t.Fatalf("chart: %+v", r)
	}
	images := 0
	for _, c := range res.Content {
		if img, ok := c.(*mcp.ImageContent); ok && img.MIMEType == "image/png" && len(img.Data) > 1000 {
			images++
		}
	}
	if images != 2 {
		t.Errorf("%d images in the result, want the two charts", images)
	}
	// The next program finds ggplot2 loaded ahead, and its search path
	// its own: nothing attached it.
	r = runCode(t, cs, map[string]any{"language": "r", "conversationId": cid,
		"code": `cat(isNamespaceLoaded("ggplot2"), "package:ggplot2" %in% search(), "\n")`})
	if r.Stdout != "TRUE FALSE \n" {
		t.Errorf("the program after a chart: %+v", r)
	}
	// What a program plants for R's start (a profile, an environ file, a
	// user library) never runs in the R started ahead for the next one.
	r = runCode(t, cs, map[string]any{"language": "r", "conversationId": cid, "code": `for (f in c("/data/.Rprofile", "/tmp/.Rprofile"))
  writeLines('writeLines("ran", "/data/planted-ran.txt")', f)
writeLines("R_PROFILE_USER=/data/.Rprofile", "/data/.Renviron")
lib <- file.path("/tmp/R", R.version$platform, "library", "stats")
dir.create(file.path(lib, "R"), recursive = TRUE)
writeLines('writeLines("ran", "/data/planted-ran.txt")', file.path(lib, "R", "stats"))
cat("planted\n")`})
	if r.Stdout != "planted\n" {
		t.Fatalf("plant: %+v", r)
	}
	for range 2 {
		r = runCode(t, cs, map[string]any{"language": "r", "conversationId": cid,
			"code": `cat(file.exists("/data/planted-ran.txt"), sum(grepl("^/tmp", .libPaths())), "\n")`})
		if r.Stdout != "FALSE 0 \n" {
			t.Errorf("after planting: %+v", r)
		}
	}
}

// sqlCSV: a CSV uploaded to /data is imported and queried.
func sqlCSV(t *testing.T, cs *mcp.ClientSession, cid string) {
	var up struct{ Name string }
	csv := "region,amount\nnorth,10\nsouth,32\nnorth,5\n"
	call(t, cs, "upload_file", map[string]any{"conversationId": cid, "filename": "sales.csv",
		"content_base64": base64.StdEncoding.EncodeToString([]byte(csv))}, &up)
	r := runCode(t, cs, map[string]any{"language": "sql", "conversationId": cid, "code": `.open /data/sales.db
.import --csv /data/sales.csv sales
SELECT region, sum(amount) FROM sales GROUP BY region ORDER BY region;`})
	if r.Stdout != "north|15\nsouth|32\n" || !r.Success {
		t.Errorf("csv: %+v", r)
	}
	found := false
	for _, a := range r.Artifacts {
		found = found || a.Name == "sales.db"
	}
	if !found {
		t.Errorf("sales.db is not an artifact: %+v", r.Artifacts)
	}
}

// shellIn returns a program of lang that runs the shell script (as sh,
// from stdin: nothing of it is on any command line).
func shellIn(lang language, script string) string {
	cmd := fmt.Sprintf("echo %s | base64 -d | sh", base64.StdEncoding.EncodeToString([]byte(script)))
	return strings.ReplaceAll(lang.shell, "CMD", cmd)
}

// TestLanguageContainment runs, in each new runner image, what
// containment_test.go and recycle_test.go check of the first ones: a
// process a program leaves behind (in the background, in its own session)
// is gone when its run is, and a sandbox recycled to another conversation
// keeps nothing of the first: no process, no file in /tmp, /dev/shm or
// the exec folder, no compiled program. A repeated program runs from the
// build cache.
func TestLanguageContainment(t *testing.T) {
	s := start(t, options{env: []string{"SANDBOX_MAX_WARM=1", "SANDBOX_POOL=0", "EXECUTOR_CONCURRENCY=3"}})
	cs := s.session(nil)
	const leave = `sh -c 'while :; do date >> /data/left.txt; sleep .1; done # zzleft' >/dev/null 2>&1 &
setsid sh -c 'while :; do date >> /data/left2.txt; sleep .1; done # zzleft' >/dev/null 2>&1 &
echo leak > /tmp/leak; echo leak > /dev/shm/leak; echo leak > /run/runbox/leak 2>/dev/null
sleep 0.3; cat /etc/hostname`
	// Prints whether anything still writes, how many processes are left,
	// and how many programs the build cache holds.
	const check = `a=$(cat /data/left.txt /data/left2.txt | wc -c); sleep 1.5; b=$(cat /data/left.txt /data/left2.txt | wc -c)
[ "$a" = "$b" ] && echo quiet || echo writing
n=0; for f in /proc/[0-9]*/cmdline; do tr '\0' ' ' < "$f" 2>/dev/null | grep -q 'zz[l]eft' && n=$((n+1)); done; echo left=$n
echo cached=$(ls /run/runbox/cache 2>/dev/null | wc -l)`
	// Run in the recycled sandbox of another conversation.
	const fresh = `cat /etc/hostname; ls -A /tmp/leak /run/runbox/leak 2>/dev/null; ls -A /dev/shm
for f in /proc/[0-9]*/cmdline; do tr '\0' ' ' < "$f"; echo; done | grep 'zz[l]eft\|[s]leep'
echo cached=$(ls /run/runbox/cache 2>/dev/null | wc -l)`
	recycled := func(host string) bool {
		s.mu.Lock()
		defer s.mu.Unlock()
		for _, p := range s.procs {
			for line := range strings.SplitSeq(p.out.String(), "\n") {
				if strings.Contains(line, "recycled a sandbox") && strings.Contains(line, "container="+host) {
					return true
				}
			}
		}
		return false
	}
	for _, lang := range languages {
		t.Run(lang.name, func(t *testing.T) {
			t.Parallel()
			run := func(cid, script string) result {
				t.Helper()
				r := runCode(t, cs, map[string]any{"language": lang.name, "conversationId": cid, "code": shellIn(lang, script)})
				if !r.Success {
					t.Fatalf("%s: %+v", cid, r)
				}
				return r
			}
			first := "contain-a-" + lang.name
			host := strings.TrimSpace(run(first, leave).Stdout)
			cached := "cached=2" // the program that left, this one
			if !lang.compiled {
				cached = "cached=0"
			}
			want := "quiet\nleft=0\n" + cached + "\n"
			for range 2 { // the second from the cache
				if r := run(first, check); r.Stdout != want {
					t.Errorf("after a program left processes: %q, want %q", r.Stdout, want)
				}
			}
			// Another conversation evicts the first (one warm sandbox per
			// language), whose sandbox is reset into the pool and taken by
			// the next new conversation.
			run("contain-b-"+lang.name, "echo b")
			waitFor(t, func() bool { return recycled(host) })
			cached = "cached=1" // this one
			if !lang.compiled {
				cached = "cached=0"
			}
			if r := run("contain-c-"+lang.name, fresh); r.Stdout != host+"\n"+cached+"\n" {
				t.Errorf("the recycled sandbox: %q, want %q (the first conversation's sandbox, nothing of it left)", r.Stdout, host+"\n"+cached)
			}
		})
	}
}
