package kubeletnode

import (
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"syscall"
)

// cachedBuild is what a test process builds once into the user's cache directory
// (<cache>/dynamig/<name>, where go keeps its build cache too), unless an environment
// variable names one built already: the kubelet (Binary) and the real runtime (RuntimeTools).
type cachedBuild struct {
	env   string                  // the environment variable naming a built one
	what  string                  // for messages
	name  func() (string, error)  // its name in <cache>/dynamig
	check func(path string) error // whether a path env names is usable
	build func(path string) error // builds it at path

	once sync.Once
	path string
	err  error
}

func (c *cachedBuild) get() (string, error) {
	if p := os.Getenv(c.env); p != "" {
		if err := c.check(p); err != nil {
			return "", fmt.Errorf("%s=%s: %w", c.env, p, err)
		}
		return p, nil
	}
	c.once.Do(func() {
		cache, err := os.UserCacheDir()
		if err != nil {
			c.err = fmt.Errorf("no cache directory to build %s in (set %s): %w", c.what, c.env, err)
			return
		}
		dir := filepath.Join(cache, "dynamig")
		if c.err = os.MkdirAll(dir, 0o755); c.err != nil {
			return
		}
		// One build at a time (make test runs two minors' test packages at once): the others
		// wait, then build again from go's build cache.
		name, err := c.name()
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
		if c.err = c.build(c.path); c.err != nil {
			c.err = fmt.Errorf("building %s: %w", c.what, c.err)
		}
	})
	return c.path, c.err
}
