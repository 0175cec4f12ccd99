// Package usercache builds what tests need once into the user's cache directory
// (<cache>/dynamig/<name>, where go keeps its build cache too) and reuses it: the kubelet of a
// minor (test/kubeletnode) and the real runtime (test/kubeletnode/runtimetools).
package usercache

import (
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"syscall"
)

// Build is one thing built once per process into the user's cache directory, unless an
// environment variable names one built already.
type Build struct {
	Env   string                  // the environment variable naming a built one
	What  string                  // for messages
	Name  func() (string, error)  // its name in <cache>/dynamig
	Check func(path string) error // whether a path Env names is usable
	Make  func(path string) error // builds it at path

	once sync.Once
	path string
	err  error
}

// Get returns the path of the built thing: Env's, or <cache>/dynamig/<Name>, built there now
// (Make) under a lock, since make test runs two minors' test packages at once: the others
// wait, then Make again, which finds what is built.
func (c *Build) Get() (string, error) {
	if p := os.Getenv(c.Env); p != "" {
		if err := c.Check(p); err != nil {
			return "", fmt.Errorf("%s=%s: %w", c.Env, p, err)
		}
		return p, nil
	}
	c.once.Do(func() {
		cache, err := os.UserCacheDir()
		if err != nil {
			c.err = fmt.Errorf("no cache directory to build %s in (set %s): %w", c.What, c.Env, err)
			return
		}
		dir := filepath.Join(cache, "dynamig")
		if c.err = os.MkdirAll(dir, 0o755); c.err != nil {
			return
		}
		name, err := c.Name()
		if err != nil {
			c.err = err
			return
		}
		lock, err := os.OpenFile(filepath.Join(dir, name+".lock"), os.O_CREATE|os.O_RDWR, 0o644)
		if err != nil {
			c.err = err
			return
		}
		defer lock.Close()
		if c.err = syscall.Flock(int(lock.Fd()), syscall.LOCK_EX); c.err != nil {
			return
		}
		c.path = filepath.Join(dir, name)
		if c.err = c.Make(c.path); c.err != nil {
			c.err = fmt.Errorf("building %s: %w", c.What, c.err)
		}
	})
	return c.path, c.err
}
