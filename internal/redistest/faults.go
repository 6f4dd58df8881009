package redistest

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// Reply faults: Redis is up and answers, but with an error reply that means
// it cannot serve a write now (docs/DESIGN.md, "The fault model": answering
// wrong). Each helper puts one fault in place and returns once a script
// write from a new connection, authenticated as the clients are, fails with
// the fault's error prefix (ScriptWrite). The undo it returns lifts the
// fault and returns once such a write succeeds again; it runs at most once,
// and at the end of the test if the test did not call it. The data set is
// kept through every fault.
//
// Call a helper and its undo from the test's goroutine: they fail the test
// when Redis does not behave as described.

// FaultTimeout bounds the wait for a fault to show, and for it to go once
// lifted.
const FaultTimeout = 5 * time.Second

// ProbeKey is the key ScriptWrite writes.
const ProbeKey = "redistest:fault-probe"

// probeScript writes one key: what a limiter's decision script does.
const probeScript = "return redis.call('SET', KEYS[1], ARGV[1])"

// ScriptWrite runs, over a new connection that authenticates with the
// URL's password, a script that SETs ProbeKey, and returns the error (nil
// when the write succeeded). A Redis error reply's message starts with its
// prefix: "OOM command not allowed ...".
func (s *Server) ScriptWrite() error {
	c := s.client(s.conf.password, time.Second)
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	return c.Eval(ctx, probeScript, []string{ProbeKey}, "x").Err()
}

// waitWrite waits until ScriptWrite fails with an error starting with
// prefix, or, for prefix "", succeeds.
func (s *Server) waitWrite(t testing.TB, prefix string) {
	t.Helper()
	deadline := time.Now().Add(FaultTimeout)
	for {
		err := s.ScriptWrite()
		if prefix == "" && err == nil || prefix != "" && err != nil && strings.HasPrefix(err.Error(), prefix) {
			return
		}
		if time.Now().After(deadline) {
			want := "succeed"
			if prefix != "" {
				want = "fail with " + prefix
			}
			t.Fatalf("redistest: a script write did not %s within %v: last error %v", want, FaultTimeout, err)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// undoOnce returns lift as an undo that runs once, waits for writes to
// succeed again, and runs at the end of the test if not called before (on
// a running server).
func (s *Server) undoOnce(t testing.TB, lift func()) func() {
	var once sync.Once
	undo := func() {
		once.Do(func() {
			lift()
			s.waitWrite(t, "")
		})
	}
	t.Cleanup(func() {
		if s.alive() {
			undo()
		}
	})
	return undo
}

// configGet returns the value of one configuration parameter.
func (s *Server) configGet(t testing.TB, name string) string {
	t.Helper()
	c := s.client(s.password(), 0)
	defer c.Close()
	m, err := c.ConfigGet(context.Background(), name).Result()
	if err != nil {
		t.Fatalf("redistest: CONFIG GET %s: %v", name, err)
	}
	v, ok := m[name]
	if !ok {
		t.Fatalf("redistest: CONFIG GET %s: no such parameter (%v)", name, m)
	}
	return v
}

// OutOfMemory sets maxmemory to 1 byte with maxmemory-policy noeviction:
// every write answers "OOM command not allowed when used memory >
// 'maxmemory'", reads still work. The undo restores both settings.
func (s *Server) OutOfMemory(t testing.TB) (undo func()) {
	t.Helper()
	limit, policy := s.configGet(t, "maxmemory"), s.configGet(t, "maxmemory-policy")
	s.Do(t, "CONFIG", "SET", "maxmemory-policy", "noeviction", "maxmemory", "1")
	s.waitWrite(t, "OOM")
	return s.undoOnce(t, func() { s.Do(t, "CONFIG", "SET", "maxmemory", limit, "maxmemory-policy", policy) })
}

// ReadOnlyReplica makes the server a replica (REPLICAOF) of a master that
// never answers: a loopback port where every connection is accepted and
// closed at once, held for the fault so no other server can appear there.
// The replica never syncs, so it keeps its data set and serves reads
// (replica-serve-stale-data), and every write answers "READONLY You can't
// write against a read only replica.". The undo sends REPLICAOF NO ONE.
func (s *Server) ReadOnlyReplica(t testing.TB) (undo func()) {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("redistest: listen for a dead master: %v", err)
	}
	var wg sync.WaitGroup
	wg.Go(func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			c.Close()
		}
	})
	stop := func() { l.Close(); wg.Wait() }
	port := strconv.Itoa(l.Addr().(*net.TCPAddr).Port)
	s.Do(t, "REPLICAOF", "127.0.0.1", port)
	s.waitWrite(t, "READONLY")
	return s.undoOnce(t, func() {
		defer stop()
		s.Do(t, "REPLICAOF", "NO", "ONE")
	})
}

// DenyScripts takes the script commands (EVAL, EVALSHA, their read-only
// forms, FCALL, FCALL_RO) from the default user's ACL: a script answers
// "NOPERM this user has no permissions to run the 'evalsha' command", on
// connections already authenticated too. The undo gives the user +@all.
func (s *Server) DenyScripts(t testing.TB) (undo func()) {
	t.Helper()
	s.Do(t, "ACL", "SETUSER", "default", "-eval", "-evalsha", "-eval_ro", "-evalsha_ro", "-fcall", "-fcall_ro")
	s.waitWrite(t, "NOPERM")
	return s.undoOnce(t, func() { s.Do(t, "ACL", "SETUSER", "default", "+@all") })
}

// PauseWrites freezes the server for writers without stopping it: CLIENT
// PAUSE WRITE holds every command that may write (EVAL and EVALSHA among
// them, whatever the script does) and every later command on that
// connection, while PING, reads and new connections' handshakes are
// answered at once. Redis runs the held commands when the pause ends, late:
// a freeze that a PING or a connection check does not see. The pause ends
// by itself after limit. The undo sends CLIENT UNPAUSE.
func (s *Server) PauseWrites(t testing.TB, limit time.Duration) (undo func()) {
	t.Helper()
	s.Do(t, "CLIENT", "PAUSE", strconv.FormatInt(limit.Milliseconds(), 10), "WRITE")
	return s.undoOnce(t, func() { s.Do(t, "CLIENT", "UNPAUSE") })
}

// RotatePassword changes the password (CONFIG SET requirepass) and closes
// every client connection but the one that sends CLIENT KILL, so clients
// must authenticate again, with the password their URL carries: that
// answers "WRONGPASS invalid username-password pair or user is disabled.".
// The server must have been started WithPassword. Do uses the new password
// while the fault lasts. The undo sets the old password back.
func (s *Server) RotatePassword(t testing.TB) (undo func()) {
	t.Helper()
	old := s.conf.password
	if old == "" {
		t.Fatal("redistest: RotatePassword needs a server started WithPassword")
	}
	rotated := old + "-rotated"
	s.Do(t, "CONFIG", "SET", "requirepass", rotated)
	s.mu.Lock()
	s.ctlPass = rotated
	s.mu.Unlock()
	s.Do(t, "CLIENT", "KILL", "TYPE", "normal", "SKIPME", "yes")
	s.Do(t, "CLIENT", "KILL", "TYPE", "pubsub", "SKIPME", "yes")
	s.waitWrite(t, "WRONGPASS")
	return s.undoOnce(t, func() {
		s.Do(t, "CONFIG", "SET", "requirepass", old)
		s.mu.Lock()
		s.ctlPass = ""
		s.mu.Unlock()
	})
}

// BusyMax bounds the script BusyScript runs: it stops by itself after this
// long of Redis time even if never killed.
const BusyMax = 30 * time.Second

// busyScript spins until ARGV[1] microseconds of Redis time have passed.
// It writes nothing, so SCRIPT KILL can stop it.
const busyScript = `local s = redis.call('TIME')
while true do
  local n = redis.call('TIME')
  if (n[1] - s[1]) * 1000000 + (n[2] - s[2]) >= tonumber(ARGV[1]) then return 'done' end
end`

// BusyScript lowers busy-reply-threshold to 100 ms and runs, from a
// connection of its own, a script that spins (for at most BusyMax): once it
// has run 100 ms every other command but SCRIPT KILL and SHUTDOWN NOSAVE
// answers "BUSY Redis is busy running a script.". It keeps one core of the
// machine busy while it runs. The undo sends SCRIPT KILL and restores the
// threshold.
func (s *Server) BusyScript(t testing.TB) (undo func()) {
	t.Helper()
	threshold := s.configGet(t, "busy-reply-threshold")
	s.Do(t, "CONFIG", "SET", "busy-reply-threshold", "100")
	spin := s.client(s.password(), BusyMax+5*time.Second)
	done := make(chan error, 1)
	go func() {
		done <- spin.Eval(context.Background(), busyScript, nil, BusyMax.Microseconds()).Err()
	}()
	s.waitWrite(t, "BUSY")
	return s.undoOnce(t, func() {
		defer spin.Close()
		ctl := s.client(s.password(), time.Second)
		defer ctl.Close()
		deadline := time.Now().Add(FaultTimeout)
		for {
			err := ctl.ScriptKill(context.Background()).Err()
			if err == nil || strings.HasPrefix(fmt.Sprint(err), "NOTBUSY") {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("redistest: SCRIPT KILL: %v", err)
			}
			time.Sleep(10 * time.Millisecond)
		}
		select {
		case <-done:
		case <-time.After(FaultTimeout):
			t.Fatal("redistest: the busy script did not end after SCRIPT KILL")
		}
		s.Do(t, "CONFIG", "SET", "busy-reply-threshold", threshold)
	})
}

// FailedSave makes a background save fail: with a save point set and
// rdb-key-save-delay slowing the save child down, it starts BGSAVE and
// kills the child (SIGKILL). With stop-writes-on-bgsave-error (the default)
// every write then answers "MISCONF Redis is configured to save RDB
// snapshots, but it's currently unable to persist to disk.". The undo saves
// again, successfully, and restores the save points (removing the RDB file
// if there was none before).
func (s *Server) FailedSave(t testing.TB) (undo func()) {
	t.Helper()
	save := s.configGet(t, "save")
	rdb := filepath.Join(s.dir, s.configGet(t, "dbfilename"))
	_, statErr := os.Stat(rdb)
	hadRDB := statErr == nil
	s.Do(t, "SET", ProbeKey, "x") // a key for the child to be slow on
	s.Do(t, "CONFIG", "SET", "rdb-key-save-delay", "1000000", "save", "3600 1")
	s.Do(t, "BGSAVE")
	child := s.saveChild(t)
	if err := syscall.Kill(child, syscall.SIGKILL); err != nil {
		t.Fatalf("redistest: kill the save child %d: %v", child, err)
	}
	s.waitWrite(t, "MISCONF")
	return s.undoOnce(t, func() {
		s.Do(t, "CONFIG", "SET", "rdb-key-save-delay", "0")
		s.Do(t, "BGSAVE")
		s.waitSaved(t)
		s.Do(t, "CONFIG", "SET", "save", save)
		if !hadRDB {
			_ = os.Remove(rdb)
		}
	})
}

// saveChild returns the PID of the server's fork (the BGSAVE child).
func (s *Server) saveChild(t testing.TB) int {
	t.Helper()
	s.mu.Lock()
	pid := 0
	if s.proc != nil {
		pid = s.proc.cmd.Process.Pid
	}
	s.mu.Unlock()
	if pid == 0 {
		t.Fatal("redistest: the server is not running")
	}
	deadline := time.Now().Add(FaultTimeout)
	for {
		stats, _ := filepath.Glob("/proc/[0-9]*/stat")
		for _, f := range stats {
			b, err := os.ReadFile(f)
			if err != nil {
				continue
			}
			// pid (comm) state ppid ...; comm may hold spaces and parens.
			rest := string(b[strings.LastIndexByte(string(b), ')')+1:])
			if fs := strings.Fields(rest); len(fs) > 1 && fs[1] == strconv.Itoa(pid) {
				child, _ := strconv.Atoi(filepath.Base(filepath.Dir(f)))
				return child
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("redistest: no child of redis-server %d after BGSAVE", pid)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// waitSaved waits until no background save runs and the last one
// succeeded.
func (s *Server) waitSaved(t testing.TB) {
	t.Helper()
	deadline := time.Now().Add(FaultTimeout)
	for {
		info := s.Do(t, "INFO", "persistence")
		if strings.Contains(info, "rdb_bgsave_in_progress:0") && strings.Contains(info, "rdb_last_bgsave_status:ok") {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("redistest: background save not done within %v:\n%s", FaultTimeout, info)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// Loading keys: SlowLoad's filler, one per millisecond of loading.
const (
	loadKeyPrefix = "redistest:load:"
	loadValueSize = 1000
	loadKeyDelay  = "1000" // key-load-delay, µs per key
)

// SlowLoad restarts the server on a data set that takes about d to load,
// so that for that long every command but a few (HELLO, AUTH, INFO...)
// answers "LOADING Redis is loading the dataset in memory". It adds one
// filler key of 1000 bytes per millisecond of d (about 1.1 MB of memory per
// second of d), saves everything with SHUTDOWN SAVE (no write is lost),
// and starts the server again with key-load-delay (1 ms per key) and
// loading-process-events-interval-bytes 1024, so it answers while it
// loads. Clients see a refused or reset connection for a few milliseconds,
// then LOADING. The server must not use WithAOF (it would load its AOF
// instead). SlowLoad returns once the server answers LOADING; wait returns
// once a script write succeeds again, having deleted the filler keys and
// the RDB file, and reports the last moment the server was seen loading.
func (s *Server) SlowLoad(t testing.TB, d time.Duration) (wait func() (lastLoading time.Time)) {
	t.Helper()
	if s.conf.aof {
		t.Fatal("redistest: SlowLoad needs a server without WithAOF")
	}
	n := max(1, int(d/time.Millisecond))
	rdb := filepath.Join(s.dir, s.configGet(t, "dbfilename"))
	s.Do(t, "CONFIG", "SET", "rdbcompression", "no")
	s.Do(t, "EVAL", "for i = 1, tonumber(ARGV[1]) do redis.call('SET', ARGV[2] .. i, string.rep('x', tonumber(ARGV[3]))) end",
		"0", strconv.Itoa(n), loadKeyPrefix, strconv.Itoa(loadValueSize))

	s.mu.Lock()
	ctl := redis.NewClient(&redis.Options{Addr: net.JoinHostPort("127.0.0.1", strconv.Itoa(s.port)), Password: s.passwordLocked(),
		MaxRetries: -1, DisableIdentity: true, TLSConfig: s.clientTLS(), PoolSize: 1})
	err := ctl.Do(context.Background(), "SHUTDOWN", "SAVE").Err()
	ctl.Close()
	p := s.proc
	select {
	case <-p.done:
	case <-time.After(StopTimeout):
		p.kill()
		s.mu.Unlock()
		t.Fatalf("redistest: SHUTDOWN SAVE (%v): the server did not exit within %v", err, StopTimeout)
	}
	s.proc = nil
	_, spawnErr := s.spawnLocked("--key-load-delay", loadKeyDelay, "--loading-process-events-interval-bytes", "1024")
	s.mu.Unlock()
	if spawnErr != nil {
		t.Fatalf("redistest: restart redis-server: %v", spawnErr)
	}

	deadline := time.Now().Add(ReadyTimeout)
	for {
		err := s.ScriptWrite()
		if err != nil && strings.HasPrefix(err.Error(), "LOADING") {
			break
		}
		if err == nil {
			t.Fatal("redistest: the server loaded before it was seen loading")
		}
		if time.Now().After(deadline) {
			t.Fatalf("redistest: no LOADING within %v: %v\n%s", ReadyTimeout, err, s.logTail())
		}
		time.Sleep(5 * time.Millisecond)
	}
	var once sync.Once
	var last time.Time
	wait = func() time.Time {
		once.Do(func() {
			deadline := time.Now().Add(2*d + FaultTimeout)
			for {
				seen := time.Now()
				err := s.ScriptWrite()
				if err == nil {
					break
				}
				if strings.HasPrefix(err.Error(), "LOADING") {
					last = seen
				}
				if time.Now().After(deadline) {
					t.Fatalf("redistest: still loading after %v", 2*d+FaultTimeout)
				}
				time.Sleep(5 * time.Millisecond)
			}
			s.Do(t, "EVAL", "for i = 1, tonumber(ARGV[1]) do redis.call('DEL', ARGV[2] .. i) end", "0", strconv.Itoa(n), loadKeyPrefix)
			_ = os.Remove(rdb)
		})
		return last
	}
	t.Cleanup(func() {
		if s.alive() {
			wait()
		}
	})
	return wait
}
