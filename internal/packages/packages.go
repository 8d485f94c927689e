// Package packages installs a run's packages into its conversation —
// pip requirements for Python, npm packages for TypeScript — under
// /data/.packages (files.PackagesDir: in the conversation's quota, out of
// its listings), and lists what a conversation has installed. The install
// is a program of the run's own language run in its sandbox before the
// code, through the egress proxy like any other.
package packages

import (
	"encoding/json"
	"errors"
	"io"
	"io/fs"
	"os"
	"path"
	"slices"
	"strings"

	"github.com/runbox-dev/runbox/internal/files"
)

// Where packages go, in the sandbox: pip's user base (PYTHONUSERBASE, as
// the python runner's image sets it) and npm's prefix.
const (
	PythonBase = "/data/" + files.PackagesDir + "/python"
	NodePrefix = "/data/" + files.PackagesDir + "/node"
)

// Env is the variable that hands the install program its packages, as
// JSON: a name no client may set (RUNBOX_ is reserved).
const Env = "RUNBOX_PACKAGES"

// pythonInstall runs pip with the requirements after "--", so that none is
// read as an option, into the user base.
const pythonInstall = `import json, os, subprocess, sys
pkgs = json.loads(os.environ.pop("RUNBOX_PACKAGES"))
sys.exit(subprocess.run([sys.executable, "-m", "pip", "install", "--user", "--break-system-packages",
    "--no-cache-dir", "--disable-pip-version-check", "--no-input", "--progress-bar", "off",
    "--no-warn-script-location", "--", *pkgs]).returncode)
`

// typescriptInstall runs npm into the prefix, where runs find it.
const typescriptInstall = `import { spawnSync } from "node:child_process";
const pkgs: string[] = JSON.parse(process.env.RUNBOX_PACKAGES ?? "[]");
delete process.env.RUNBOX_PACKAGES;
const r = spawnSync("npm", ["install", "--prefix", "` + NodePrefix + `", "--no-save", "--no-audit", "--no-fund",
  "--no-update-notifier", "--loglevel=error", "--", ...pkgs], { stdio: "inherit" });
process.exit(r.status ?? 1);
`

// Program returns the program that installs pkgs in a language's sandbox,
// and the variables it needs; false for a language without packages.
func Program(language string, pkgs []string) (string, map[string]string, bool) {
	list, err := json.Marshal(pkgs)
	if err != nil {
		return "", nil, false
	}
	switch language {
	case "python":
		return pythonInstall, map[string]string{Env: string(list), "PYTHONUSERBASE": PythonBase}, true
	case "typescript":
		return typescriptInstall, map[string]string{Env: string(list)}, true
	}
	return "", nil, false
}

// maxManifest bounds a package.json read for its version.
const maxManifest = 1 << 20

// Installed returns what the conversation whose folder is dataDir has
// installed for a language: name==version (pip), name@version (npm),
// sorted. The folder is the programs': nothing in it is followed out.
func Installed(dataDir, language string) ([]string, error) {
	root, err := os.OpenRoot(dataDir)
	if err != nil {
		return nil, err
	}
	defer root.Close()
	fsys := root.FS()
	var out []string
	switch language {
	case "python":
		out, err = pythonInstalled(fsys)
	case "typescript":
		out, err = nodeInstalled(root)
	}
	if errors.Is(err, fs.ErrNotExist) {
		err = nil
	}
	slices.Sort(out)
	return out, err
}

// pythonInstalled reads the dist-info folders' names, {name}-{version}:
// a wheel's name has no '-', its version none either.
func pythonInstalled(fsys fs.FS) ([]string, error) {
	lib := path.Join(files.PackagesDir, "python", "lib")
	pys, err := fs.ReadDir(fsys, lib)
	if err != nil {
		return nil, err
	}
	var out []string
	for _, py := range pys {
		entries, err := fs.ReadDir(fsys, path.Join(lib, py.Name(), "site-packages"))
		if err != nil {
			continue
		}
		for _, e := range entries {
			base, ok := strings.CutSuffix(e.Name(), ".dist-info")
			name, version, found := strings.Cut(base, "-")
			if ok && found && e.IsDir() {
				out = append(out, name+"=="+version)
			}
		}
	}
	return out, nil
}

// nodeInstalled reads node_modules/<name>/package.json and
// node_modules/@scope/<name>/package.json.
func nodeInstalled(root *os.Root) ([]string, error) {
	fsys := root.FS()
	modules := path.Join(files.PackagesDir, "node", "node_modules")
	entries, err := fs.ReadDir(fsys, modules)
	if err != nil {
		return nil, err
	}
	var dirs []string
	for _, e := range entries {
		name := e.Name()
		switch {
		case strings.HasPrefix(name, "."):
		case strings.HasPrefix(name, "@"):
			scoped, err := fs.ReadDir(fsys, path.Join(modules, name))
			if err != nil {
				continue
			}
			for _, s := range scoped {
				dirs = append(dirs, name+"/"+s.Name())
			}
		default:
			dirs = append(dirs, name)
		}
	}
	var out []string
	for _, d := range dirs {
		if v := manifestVersion(root, path.Join(modules, d, "package.json")); v != "" {
			out = append(out, d+"@"+v)
		}
	}
	return out, nil
}

func manifestVersion(root *os.Root, name string) string {
	f, err := root.Open(name)
	if err != nil {
		return ""
	}
	defer f.Close()
	var m struct {
		Version string `json:"version"`
	}
	if json.NewDecoder(io.LimitReader(f, maxManifest)).Decode(&m) != nil || len(m.Version) > 100 {
		return ""
	}
	return m.Version
}
