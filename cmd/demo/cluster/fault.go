package cluster

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// A fault is what the outage phase does to the redis-server (--fault): it
// is applied after Normal and lifted after Outage.
type fault struct {
	// name is the flag's value.
	name string
	// label marks the outage on the chart: "Redis down (SIGKILL)".
	label string
	// title says in the chart's title what happens to Redis: "killed and
	// restarted".
	title string
	// on and off name the two moments in the report: "killed", "restarted".
	on, off string
	// legend says what "DOWN" means in the table.
	legend string
	// help says in the flag's usage what the fault does and what lifts
	// it.
	help string
}

// faults are the --fault values, the default first.
var faults = []fault{
	{name: "kill", label: "Redis down (SIGKILL)", title: "killed and restarted", on: "killed", off: "restarted",
		legend: "redis DOWN: redis-server killed (SIGKILL), until restarted on the same port and AOF",
		help:   "SIGKILL, then restart on the same port and AOF"},
	{name: "stop", label: "Redis frozen (SIGSTOP)", title: "frozen (SIGSTOP) and resumed", on: "frozen", off: "resumed",
		legend: "redis DOWN: redis-server frozen (SIGSTOP: connections accepted, nothing answered), until SIGCONT",
		help:   "SIGSTOP, then SIGCONT"},
	{name: "pause", label: "Redis writes paused (CLIENT PAUSE WRITE)", title: "paused for writes (CLIENT PAUSE WRITE) and unpaused", on: "paused", off: "unpaused",
		legend: "redis DOWN: CLIENT PAUSE WRITE, every script held (PING and reads answered), until CLIENT UNPAUSE",
		help:   "CLIENT PAUSE WRITE: scripts held, PING and reads answered; then CLIENT UNPAUSE"},
	{name: "oom", label: "Redis out of memory (OOM)", title: "out of memory (maxmemory 1) and restored", on: "out of memory", off: "restored",
		legend: "redis DOWN: maxmemory 1 with noeviction, every write refused with OOM, until maxmemory is restored",
		help:   "CONFIG SET maxmemory 1 with noeviction: writes answer OOM; then maxmemory 0"},
	{name: "readonly", label: "Redis read-only (READONLY)", title: "made a read-only replica and promoted back", on: "made a replica", off: "promoted back",
		legend: "redis DOWN: redis-server a replica of a dead master, every write refused with READONLY, until REPLICAOF NO ONE",
		help:   "REPLICAOF a port that never answers: writes answer READONLY; then REPLICAOF NO ONE"},
	{name: "pauseall", label: "Redis paused (CLIENT PAUSE ALL)", title: "paused for every command (CLIENT PAUSE ALL) until the pause ran out", on: "paused", off: "pause ran out",
		legend: "redis DOWN: CLIENT PAUSE ALL for the outage, every command held (PING too; connections accepted), until the pause runs out",
		help:   "CLIENT PAUSE ALL for the outage: every command held, PING too"},
	{name: "busy", label: "Redis busy (a script spinning: BUSY)", title: "held by a spinning script (BUSY) and freed", on: "busy", off: "freed",
		legend: "redis DOWN: a script spinning, every call held 100 ms (busy-reply-threshold) and then refused with BUSY, until SCRIPT KILL",
		help:   "a script spinning: calls held 100 ms, then BUSY; then SCRIPT KILL"},
	{name: "noperm", label: "scripts denied (ACL: NOPERM)", title: "denied scripts by ACL (NOPERM) and allowed again", on: "scripts denied", off: "allowed",
		legend: "redis DOWN: ACL SETUSER default -@scripting, every script refused with NOPERM (PING answered), until +@all",
		help:   "ACL SETUSER default -@scripting: scripts answer NOPERM; then +@all"},
	{name: "noreplicas", label: "writes refused (NOREPLICAS)", title: "refusing writes without replicas (NOREPLICAS) and restored", on: "refusing writes", off: "restored",
		legend: "redis DOWN: min-replicas-to-write 1 with no replica, every write refused with NOREPLICAS, until it is 0",
		help:   "min-replicas-to-write 1: writes answer NOREPLICAS; then 0"},
	{name: "flush", label: "Redis flushed (FLUSHALL)", title: "flushed (FLUSHALL): every key lost while Redis kept answering", on: "flushed", off: "outage over",
		legend: "redis DOWN: FLUSHALL at its start, every key lost; Redis answers throughout",
		help:   "FLUSHALL: every key lost while Redis keeps answering"},
	{name: "wipe", label: "Redis restarted empty (SIGKILL, AOF removed)", title: "killed and restarted empty", on: "killed", off: "restarted empty",
		legend: "redis DOWN: killed with SIGKILL, then restarted on the same port with its AOF removed: every key lost",
		help:   "SIGKILL, then restart on the same port with the AOF removed (empty)"},
	{name: "stale", label: "Redis back on an older copy (AOF stopped)", title: "AOF stopped, then killed and restarted from it", on: "AOF stopped", off: "restarted from the old AOF",
		legend: "redis DOWN: AOF stopped at its start (CONFIG SET appendonly no), Redis answers throughout; at its end SIGKILL and a restart from that AOF: every write since lost",
		help:   "CONFIG SET appendonly no, then at the outage's end SIGKILL and a restart from the AOF as it stood (an older copy of the data)"},
	{name: "wrongpass", label: "password changed (WRONGPASS)", title: "password changed, clients dropped (NOAUTH) and restored", on: "password changed", off: "restored",
		legend: "redis DOWN: requirepass set and every client killed, so each reconnects without the password (NOAUTH), until requirepass is cleared",
		help:   "requirepass set, clients killed: reconnects answer NOAUTH; then requirepass cleared"},
}

// faultUsage is the --fault flag's usage: each value and what it does.
func faultUsage() string {
	var parts []string
	for _, f := range faults {
		parts = append(parts, f.name+" ("+f.help+")")
	}
	return "what the outage does to redis-server: " + strings.Join(parts, ", ") + "; with --redis-cluster only kill"
}

// faultNames is the --fault values joined by "|".
func faultNames() string {
	var names []string
	for _, f := range faults {
		names = append(names, f.name)
	}
	return strings.Join(names, "|")
}

// faultNamed returns the fault called name ("" is the default, kill).
func faultNamed(name string) (fault, bool) {
	if name == "" {
		return faults[0], true
	}
	for _, f := range faults {
		if f.name == name {
			return f, true
		}
	}
	return fault{}, false
}

// validFault reports whether name is a --fault value.
func validFault(name string) bool {
	_, ok := faultNamed(name)
	return ok
}

// fault returns the run's fault.
func (r *Record) fault() fault {
	f, _ := faultNamed(r.Fault)
	return f
}

// faultOn applies o.Fault to victim and returns what lifts it, and the
// progress lines for both moments (the lift's is known once it ran).
func (c *cluster) faultOn(ctx context.Context, victim *redisServer) (lift func() (string, error), event string, err error) {
	pid := victim.p.pid()
	switch c.o.Fault {
	case "stop":
		if err := victim.p.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
			return nil, "", err
		}
		victim.frozen = true
		return func() (string, error) {
			victim.frozen = false
			return fmt.Sprintf("resumed (SIGCONT pid %d)", pid), victim.p.cmd.Process.Signal(syscall.SIGCONT)
		}, fmt.Sprintf("frozen (SIGSTOP pid %d)", pid), nil
	case "pause":
		// Longer than any outage: CLIENT UNPAUSE ends it (and Redis
		// itself, if the demo dies first).
		return commandFault(victim.addr(), []string{"CLIENT", "PAUSE", "3600000", "WRITE"}, []string{"CLIENT", "UNPAUSE"},
			fmt.Sprintf("writes paused (pid %d, CLIENT PAUSE WRITE: PING and reads answered)", pid), "unpaused (CLIENT UNPAUSE)")
	case "oom":
		return commandFault(victim.addr(), []string{"CONFIG", "SET", "maxmemory-policy", "noeviction", "maxmemory", "1"}, []string{"CONFIG", "SET", "maxmemory", "0"},
			fmt.Sprintf("out of memory (pid %d, CONFIG SET maxmemory 1, maxmemory-policy noeviction)", pid), "memory restored (CONFIG SET maxmemory 0)")
	case "readonly":
		dead, err := startDeadMaster()
		if err != nil {
			return nil, "", err
		}
		if err := redisCommand(victim.addr(), "REPLICAOF", "127.0.0.1", strconv.Itoa(dead.port)); err != nil {
			dead.close()
			return nil, "", err
		}
		return func() (string, error) {
				defer dead.close()
				return "promoted back (REPLICAOF NO ONE)", redisCommand(victim.addr(), "REPLICAOF", "NO", "ONE")
			},
			fmt.Sprintf("made a replica of 127.0.0.1:%d, a master that never answers (pid %d, REPLICAOF)", dead.port, pid), nil
	case "pauseall":
		// CLIENT UNPAUSE would be held too: the pause is timed to end with
		// the outage.
		ms := strconv.FormatInt(c.o.Outage.Milliseconds(), 10)
		if err := redisCommand(victim.addr(), "CLIENT", "PAUSE", ms, "ALL"); err != nil {
			return nil, "", err
		}
		return func() (string, error) {
			return "pause ran out (" + ms + " ms)", nil
		}, fmt.Sprintf("paused (pid %d, CLIENT PAUSE %s ALL: every command held, PING too)", pid, ms), nil
	case "busy":
		// Calls are held 100 ms before Redis answers BUSY; the spin ends
		// with SCRIPT KILL (it writes nothing, so it can be killed).
		if err := redisCommand(victim.addr(), "CONFIG", "SET", "busy-reply-threshold", "100"); err != nil {
			return nil, "", err
		}
		spin, err := redisSend(victim.addr(), "EVAL", "while true do end", "0")
		if err != nil {
			return nil, "", err
		}
		return func() (string, error) {
			defer spin.Close()
			if err := redisCommand(victim.addr(), "SCRIPT", "KILL"); err != nil {
				return "", err
			}
			// SCRIPT KILL only asks: the script stops at its next hook,
			// and until then Redis still answers BUSY. Its own reply (the
			// kill's error) says it has stopped.
			spin.SetReadDeadline(time.Now().Add(2 * time.Second))
			_, _ = bufio.NewReader(spin).ReadString('\n')
			return "freed (SCRIPT KILL)", untilNotBusy(func() error {
				return redisCommand(victim.addr(), "CONFIG", "SET", "busy-reply-threshold", "5000")
			})
		}, fmt.Sprintf("busy (pid %d, a script spinning; busy-reply-threshold 100 ms)", pid), nil
	case "noperm":
		return commandFault(victim.addr(), []string{"ACL", "SETUSER", "default", "-@scripting"}, []string{"ACL", "SETUSER", "default", "+@all"},
			fmt.Sprintf("scripts denied (pid %d, ACL SETUSER default -@scripting)", pid), "scripts allowed (ACL SETUSER default +@all)")
	case "noreplicas":
		return commandFault(victim.addr(), []string{"CONFIG", "SET", "min-replicas-to-write", "1"}, []string{"CONFIG", "SET", "min-replicas-to-write", "0"},
			fmt.Sprintf("refusing writes (pid %d, CONFIG SET min-replicas-to-write 1, no replica)", pid), "writes allowed (CONFIG SET min-replicas-to-write 0)")
	case "flush":
		if err := redisCommand(victim.addr(), "FLUSHALL"); err != nil {
			return nil, "", err
		}
		return func() (string, error) { return "outage over (nothing to undo)", nil }, fmt.Sprintf("flushed (pid %d, FLUSHALL: every key lost)", pid), nil
	case "stale":
		// The AOF keeps the data as it stands now, and nothing after: the
		// restart loads it, as Redis restarted from an old snapshot or a
		// lagging AOF does.
		if err := redisCommand(victim.addr(), "CONFIG", "SET", "appendonly", "no"); err != nil {
			return nil, "", err
		}
		return func() (string, error) {
			victim.kill()
			if err := restart(ctx, victim); err != nil {
				return "", err
			}
			return fmt.Sprintf("restarted from the old AOF (pid %d, same port: the writes since it stopped lost)", victim.p.pid()), nil
		}, fmt.Sprintf("AOF stopped (pid %d, CONFIG SET appendonly no; Redis answers on)", pid), nil
	case "wrongpass":
		const pass = "holdfast-demo-rotated"
		if err := redisCommand(victim.addr(), "CONFIG", "SET", "requirepass", pass); err != nil {
			return nil, "", err
		}
		// Every connection, this one's too, is dropped; the instances
		// reconnect without the password.
		auth := []string{"AUTH", pass}
		_ = redisCommands(victim.addr(), auth, []string{"CLIENT", "KILL", "TYPE", "normal"})
		return func() (string, error) {
			return "password cleared (CONFIG SET requirepass \"\")", redisCommands(victim.addr(), auth, []string{"CONFIG", "SET", "requirepass", ""})
		}, fmt.Sprintf("password changed (pid %d, CONFIG SET requirepass, CLIENT KILL TYPE normal)", pid), nil
	}
	victim.kill()
	wipe := c.o.Fault == "wipe"
	return func() (string, error) {
		if wipe {
			// Its AOF (Redis 7 keeps it in appendonlydir) and any
			// snapshot: the restart comes back empty.
			for _, name := range []string{"appendonlydir", "dump.rdb"} {
				if err := os.RemoveAll(filepath.Join(victim.dir, name)); err != nil {
					return "", err
				}
			}
		}
		if err := restart(ctx, victim); err != nil {
			return "", err
		}
		if wipe {
			return fmt.Sprintf("restarted empty (pid %d, same port, AOF removed)", victim.p.pid()), nil
		}
		return fmt.Sprintf("restarted (pid %d, same port and AOF)", victim.p.pid()), nil
	}, fmt.Sprintf("killed (SIGKILL pid %d)", pid), nil
}

// commandFault puts in place a fault that one command to the Redis at addr
// makes and another lifts; event and lifted are the progress lines.
func commandFault(addr string, on, off []string, event, lifted string) (lift func() (string, error), _ string, err error) {
	if err := redisCommand(addr, on...); err != nil {
		return nil, "", err
	}
	return func() (string, error) { return lifted, redisCommand(addr, off...) }, event, nil
}

// deadMaster is a loopback port where every connection is accepted and
// closed at once: a replica of it never syncs, so it keeps its data, and
// no other server can take the port while it is held.
type deadMaster struct {
	l    net.Listener
	port int
	wg   sync.WaitGroup
}

func startDeadMaster() (*deadMaster, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	d := &deadMaster{l: l, port: l.Addr().(*net.TCPAddr).Port}
	d.wg.Go(func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			c.Close()
		}
	})
	return d, nil
}

func (d *deadMaster) close() {
	d.l.Close()
	d.wg.Wait()
}

// restart starts the killed victim again on its port and directory,
// retrying a refused start (the port was free a moment ago).
func restart(ctx context.Context, victim *redisServer) error {
	var err error
	for range 3 {
		if err = victim.start(ctx); err == nil {
			return nil
		}
	}
	return err
}

// untilNotBusy runs f again while Redis answers BUSY, for at most 2 s.
func untilNotBusy(f func() error) error {
	deadline := time.Now().Add(2 * time.Second)
	for {
		err := f()
		if err == nil || !strings.Contains(err.Error(), "BUSY") || time.Now().After(deadline) {
			return err
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// redisCommand sends one command to the Redis at addr over a new
// connection and returns an error unless it answers +OK.
func redisCommand(addr string, args ...string) error {
	return redisCommands(addr, args)
}

// redisCommands sends cmds in turn on one connection to the Redis at addr
// (an AUTH first authenticates the others), each answered "+OK" or an
// integer, and stops at the first that is not.
func redisCommands(addr string, cmds ...[]string) error {
	c, err := net.DialTimeout("tcp", addr, time.Second)
	if err != nil {
		return err
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(2 * time.Second))
	r := bufio.NewReader(c)
	for _, args := range cmds {
		if err := redisExchange(c, r, args); err != nil {
			return err
		}
	}
	return nil
}

// redisExchange sends one command on c and reads its reply from r: "+OK"
// or an integer, else an error naming the command and the reply.
func redisExchange(c net.Conn, r *bufio.Reader, args []string) error {
	if _, err := c.Write(respCommand(args)); err != nil {
		return err
	}
	line, err := r.ReadString('\n')
	if err != nil {
		return err
	}
	if line = strings.TrimRight(line, "\r\n"); line != "+OK" && !strings.HasPrefix(line, ":") {
		return fmt.Errorf("%s: %s", args[0], line)
	}
	return nil
}

// respCommand is args as a RESP array of bulk strings.
func respCommand(args []string) []byte {
	var b strings.Builder
	fmt.Fprintf(&b, "*%d\r\n", len(args))
	for _, a := range args {
		fmt.Fprintf(&b, "$%d\r\n%s\r\n", len(a), a)
	}
	return []byte(b.String())
}

// redisSend sends one command to the Redis at addr and returns the
// connection without reading its reply: a command that blocks Redis
// until it is ended from another connection. The caller closes it.
func redisSend(addr string, args ...string) (net.Conn, error) {
	c, err := net.DialTimeout("tcp", addr, time.Second)
	if err != nil {
		return nil, err
	}
	if _, err := c.Write(respCommand(args)); err != nil {
		c.Close()
		return nil, err
	}
	return c, nil
}
