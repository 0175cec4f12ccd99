// Package repo holds checks over the repository's own files.
package repo

import (
	"bytes"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// root is the repository root, two folders up from this package.
const root = "../.."

// outside is a path beside the checkout that the repository must never read or link: a
// clone in an empty directory has nothing there. (Spelled in two parts so that this file
// does not name it.)
var outside = []byte(".." + "/shared")

// TestNothingReadsOutsideTheRepository fails when a tracked file (code, tests, docs,
// manifests, the Makefile) names the path beside the checkout.
func TestNothingReadsOutsideTheRepository(t *testing.T) {
	files := trackedFiles(t)
	if len(files) < 50 {
		t.Fatalf("found only %d files under %s: not the repository?", len(files), root)
	}
	for _, f := range files {
		data, err := os.ReadFile(filepath.Join(root, f))
		if err != nil {
			if os.IsNotExist(err) { // deleted in the work tree, not yet in the index
				continue
			}
			t.Fatal(err)
		}
		for i, line := range bytes.Split(data, []byte("\n")) {
			if bytes.Contains(line, outside) {
				t.Errorf("%s:%d names %s: the repository must stand alone (copy what it needs in)", f, i+1, outside)
			}
		}
	}
}

// trackedFiles lists the files git tracks (and the untracked ones it does not ignore); where
// git or the checkout is missing (a source archive), every file under the root but .git
// and bin.
func trackedFiles(t *testing.T) []string {
	t.Helper()
	if out, err := exec.Command("git", "-C", root, "ls-files", "--cached", "--others", "--exclude-standard").Output(); err == nil {
		return strings.FieldsFunc(string(out), func(r rune) bool { return r == '\n' })
	}
	var files []string
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && (d.Name() == ".git" || d.Name() == "bin") {
			return filepath.SkipDir
		}
		if !d.IsDir() {
			rel, _ := filepath.Rel(root, path)
			files = append(files, rel)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return files
}
