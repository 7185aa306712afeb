package proctest

import (
	"bufio"
	"os"
	"os/exec"
	"syscall"
	"testing"
)

// Child is the running test binary started again as a child process, for crash tests: the
// package's TestMain sees an environment variable the test set and runs the child's code
// instead of the tests. The child reports on its stdout, one line per fact, and the test kills
// it with SIGKILL at a point it picks, then checks what the child left behind.
type Child struct {
	cmd   *exec.Cmd
	lines chan string
	done  chan struct{}
	err   error // cmd.Wait's, once done is closed
}

// StartChild runs os.Args[0] with -test.run=^$ (no test runs in the child: its TestMain takes
// over) and env added to this process's environment ("NAME=value"), its stderr on this
// process's stderr. It registers a cleanup that kills the child, so none outlives its test; it
// fails t if the child does not start.
func StartChild(t testing.TB, env ...string) *Child {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), env...)
	cmd.Stderr = os.Stderr
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatalf("start a child of %s: %v", os.Args[0], err)
	}
	c := &Child{cmd: cmd, lines: make(chan string, 64), done: make(chan struct{})}
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			c.lines <- sc.Text()
		}
		close(c.lines)
		c.err = cmd.Wait()
		close(c.done)
	}()
	t.Cleanup(func() { c.Kill9() })
	return c
}

// Lines delivers the child's stdout, one line at a time; it is closed once the child's stdout
// ended (it exited or was killed). A test must read it until it is closed, or call Kill9, which
// reads the rest.
func (c *Child) Lines() <-chan string { return c.lines }

// Signal9 sends SIGKILL to the child and returns at once (from a timer, say); the lines it
// printed before it died still arrive on Lines.
func (c *Child) Signal9() { _ = c.cmd.Process.Signal(syscall.SIGKILL) }

// Kill9 sends SIGKILL to the child (no deferred work runs, nothing is closed cleanly), waits
// until it ended and returns the lines it printed that were not read from Lines yet.
func (c *Child) Kill9() []string {
	c.Signal9()
	var rest []string
	for l := range c.lines {
		rest = append(rest, l)
	}
	<-c.done
	return rest
}

// Wait returns, once the child ended on its own, cmd.Wait's error (nil for exit 0). The test
// must drain Lines first or call Kill9.
func (c *Child) Wait() error {
	for range c.lines {
	}
	<-c.done
	return c.err
}
