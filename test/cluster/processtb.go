package cluster

import (
	"fmt"
	"io"
	"os"
	"strings"
	"sync"
)

// processTB is the ktesting.TB that kube-apiserver's test server wants, for a control plane
// that runs outside a test (TestMain, the sandbox): logs go to a writer, cleanups run at
// Stop, a fatal error panics with tbFailure (recovered by StartProcess).
type processTB struct {
	log io.Writer

	mu       sync.Mutex
	cleanups []func()
	failed   bool
	errs     []string
	tempDirs []string
}

// tbFailure is the panic value of processTB.FailNow.
type tbFailure struct{}

func newProcessTB(log io.Writer) *processTB {
	if log == nil {
		log = io.Discard
	}
	return &processTB{log: log}
}

func (t *processTB) Cleanup(f func()) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.cleanups = append(t.cleanups, f)
}

// runCleanups runs the registered cleanups, last first, then removes the temp dirs.
func (t *processTB) runCleanups() {
	for {
		t.mu.Lock()
		if len(t.cleanups) == 0 {
			dirs := t.tempDirs
			t.tempDirs = nil
			t.mu.Unlock()
			for _, d := range dirs {
				_ = os.RemoveAll(d)
			}
			return
		}
		f := t.cleanups[len(t.cleanups)-1]
		t.cleanups = t.cleanups[:len(t.cleanups)-1]
		t.mu.Unlock()
		f()
	}
}

func (t *processTB) failure() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return strings.Join(t.errs, "; ")
}

func (t *processTB) Error(args ...any) { t.Log(args...); t.fail(fmt.Sprint(args...)) }
func (t *processTB) Errorf(format string, args ...any) {
	t.Logf(format, args...)
	t.fail(fmt.Sprintf(format, args...))
}
func (t *processTB) fail(msg string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.failed = true
	t.errs = append(t.errs, msg)
}
func (t *processTB) Fail() { t.fail("failed") }
func (t *processTB) FailNow() {
	t.fail("failed")
	panic(tbFailure{})
}
func (t *processTB) Failed() bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.failed
}
func (t *processTB) Fatal(args ...any)                 { t.Error(args...); panic(tbFailure{}) }
func (t *processTB) Fatalf(format string, args ...any) { t.Errorf(format, args...); panic(tbFailure{}) }
func (t *processTB) Helper()                           {}
func (t *processTB) Log(args ...any)                   { fmt.Fprintln(t.log, args...) }
func (t *processTB) Logf(format string, args ...any) {
	fmt.Fprintf(t.log, strings.TrimSuffix(format, "\n")+"\n", args...)
}
func (t *processTB) Name() string             { return "dynamig-cluster" }
func (t *processTB) Setenv(key, value string) { _ = os.Setenv(key, value) }

// Attr and Chdir are in ktesting.TB from 1.36 on.
func (t *processTB) Attr(key, value string) { t.Logf("%s=%s", key, value) }
func (t *processTB) Chdir(string)           { t.Fatal("Chdir: a control plane keeps its process's directory") }

func (t *processTB) Skip(args ...any)                 { t.Fatal(append([]any{"skip: "}, args...)...) }
func (t *processTB) SkipNow()                         { t.Fatal("skip") }
func (t *processTB) Skipf(format string, args ...any) { t.Fatalf("skip: "+format, args...) }
func (t *processTB) Skipped() bool                    { return false }
func (t *processTB) TempDir() string {
	d, err := os.MkdirTemp("", "dynamig-cluster-tb-")
	if err != nil {
		t.Fatalf("TempDir: %v", err)
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	t.tempDirs = append(t.tempDirs, d)
	return d
}
