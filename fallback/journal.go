package fallback

// The state dir's journal: what an instance knows, kept across a restart.
//
// With Options.StateDir each Limiter (and each Redis Cluster shard's cell)
// keeps one append-only file, holdfast-ID[.shard].journal, of records:
//
//	H  header: magic, format version
//	P  policy: index, name, algorithm, limit, interval (so a grant can be rebuilt)
//	N  instance count and clock offset
//	G  grant: policy, storage key, the lease's seed, instance count, request
//	   id, cost, time; flags say whether it is in the outage log, spent from
//	   the key's lease, or both
//	K  known state of a key (the last Redis reply), for the tracked keys,
//	   written when the breaker leaves Closed: during an outage no Redis
//	   reply changes it
//	E  a key's known state and lease as a whole (snapshots only)
//	S  sealed batch: id, key, policy, seed and its grants; it also ends the
//	   key's open grants logged before it
//	A  acknowledged batch ids
//
// Each record is framed as [length u32][payload][CRC-32C of payload], so a
// reader stops at the first torn or damaged record and keeps every record
// before it: a crash cuts the file at worst inside its last record.
//
// Group commit. The request path only appends a record to an in-memory
// buffer under one mutex: no syscall, no CRC (the flusher fills the CRCs in
// place), and a token bucket grant that follows a grant of the same key
// within a millisecond adds its cost to that record in place, as the outage
// log coalesces (charged at the later time: never under-counted), so a hot
// key writes about one record a millisecond. Every StateFlush (default
// 100ms) a goroutine swaps the buffer, writes it and fsyncs. So a SIGKILL
// loses at most the grants of the last StateFlush (the buffer: what was
// handed to write(2) is in the page cache and survives the process), and a
// machine crash at most those plus one fsync's worth. Close writes
// everything.
//
// The flusher also applies every record it writes to a mirror (jstate):
// the state a restart would read back from the file, built by the same
// code. Compaction writes the mirror as a fresh snapshot to a temp file,
// fsyncs it and renames it over the journal (then fsyncs the directory):
// at start, at Close, when the outage log has become empty after a replay,
// when the file has grown past max(4 MiB, 4 × the last snapshot), and after
// a failed write (an append that failed part way could leave a torn record
// in the middle of the file; the snapshot replaces it). A crash at any point
// leaves either the old file or the new one.
//
// Restore (New): the mirror read back gives the sealed batches not yet
// acknowledged, with their ids (the replay scripts mark batch ids, so a
// batch Redis applied before the stop is not counted twice: a replay
// waits for its seal records to be on disk before it sends, syncNow); the
// open grants (logged again, sealed under new ids when replayed); the
// instance count (max(ExpectedInstances, saved)) and clock offset; and each key's known
// state and lease. A lease is rebuilt from its seed and the grants spent
// from it since (keyState.charge, the admitting half of decideLease), so an
// instance restarted during an outage continues each lease where it stood
// instead of granting a fresh share.
//
// Which grants a seal covered is told by order: a grant's record is
// appended after the outage log took it, and a seal record while the log's
// lock is held, after the key's live grant was closed. A grant recorded
// before its key's seal record is therefore in that batch or an earlier
// one. A grant recorded after it is usually not; the exception (a grant the
// log took just before the seal whose record lands just after) is restored
// as open and replayed twice after a crash: at most one grant per key and
// seal, an under-admission, never an over-admission.
//
// Bounds: known states are written for the StateKeys keys most recently
// new to the lease store or in use (the cell's recent-keys ring, which a
// restore reads too), and the snapshot keeps the known states and leases of
// the StateKeys most recently used keys (keys with unreplayed grants
// always). The mirror's open grants are bounded and compacted as the
// outage log's are (MaxLogGrants). A buffer past 4 MiB is flushed before
// its interval ends.

import (
	"cmp"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"hash/crc32"
	"log/slog"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/holdfast/holdfast/backend/memory"
	"github.com/holdfast/holdfast/core"
	"github.com/holdfast/holdfast/core/driver"
)

const (
	journalMagic      = "holdfast-journal"
	journalVersion    = 1
	defaultStateFlush = 100 * time.Millisecond
	defaultStateKeys  = 10_000
	// kickBytes is the buffer size that triggers a flush before the
	// interval ends.
	kickBytes = 4 << 20
	// compactBytes is the file size below which growth alone never
	// triggers a compaction.
	compactBytes = 4 << 20
	// logEmptySlack: once the outage log is empty the file is compacted if
	// it grew this much past its last snapshot.
	logEmptySlack = 64 << 10
)

// Record types.
const (
	recHeader = 'H'
	recPolicy = 'P'
	recCount  = 'N'
	recGrant  = 'G'
	recKnown  = 'K'
	recLease  = 'E'
	recSealed = 'S'
	recAcked  = 'A'
	// recReset forgets a key (its known state, lease and unreplayed
	// grants) and records a Reset to apply in Redis; recResetDone marks it
	// applied.
	recReset     = 'R'
	recResetDone = 'D'
	// recReplayed keeps the grants of a key that a replay applied in
	// Redis, for a restore after a later data loss (keyState.replayed).
	recReplayed = 'Y'
)

// Grant record flags.
const (
	grantLogged = 1 << iota // the grant is in the outage log
	grantLeased             // the grant was spent from the key's lease
	grantWhole              // a snapshot's coalesced grant: joins no other
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

var (
	errTorn    = errors.New("torn record")
	errDamaged = errors.New("damaged record (CRC mismatch)")
	errBadRec  = errors.New("malformed record")
	errVersion = errors.New("unknown format")
)

// journal is a Limiter's state dir file; see the top of this file.
type journal struct {
	path, legacy string
	keyPrefix    string
	every        time.Duration
	maxKeys      int
	logger       *slog.Logger
	id           string
	counts       func() (n, offset, epoch, gen int64)
	leases       *memory.Store

	mu   sync.Mutex
	enc  jenc  // the records not yet flushed; CRCs unfilled
	coal jcoal // the last record, if a token bucket grant may join it

	recent *recentKeys // the cell's: whose known states writeKnown writes

	kick    chan struct{}      // flush now (buffer large, outage began)
	syncs   chan chan struct{} // flush now and say when it is durable (syncNow)
	outage  atomic.Bool        // the breaker left Closed: write the known states
	stop    chan struct{}
	done    chan struct{}
	ended   atomic.Bool // closed or abandoned: nothing more is written
	running atomic.Bool // the flusher was started

	// Owned by the flusher (before it starts and after it stops: by
	// openJournal and close).
	f           *os.File
	size        int64 // bytes in the file
	snapSize    int64 // bytes of the last snapshot
	st          *jstate
	spare       []byte
	wroteCount  int64
	wroteOff    int64
	wroteEpoch  int64
	wroteGen    int64
	broken      bool  // a write failed: the next flush rewrites the file
	written     int64 // bytes written, appends and snapshots
	compactions int
	warned      time.Time

	// What New read back, for logs and tests.
	restored jrestored
}

type jrestored struct {
	sealed, open, keys int
	cost               int64 // units of the restored grants
	instances          int64
	dropped            int // bytes of a torn or damaged tail not read
}

type trackedKey struct {
	skey string
	p    core.Policy
}

// jcoal is where the last grant record's cost and time are, while a
// token bucket grant of the same key may still join it.
type jcoal struct {
	off            int // offset of the cost field (the time follows); -1: none
	keyOff, keyLen int // the client key's bytes in the buffer
	name           string
	flags          byte
	n              int64
	seed           driver.Seed
	start, at      int64
}

// jenc encodes records into buf, with the policy table of the stream it
// writes (indices defined by P records earlier in the same file).
type jenc struct {
	buf      []byte
	pols     map[string]jpol
	npol     uint64
	lastName string
	lastPol  jpol
}

type jpol struct {
	idx uint64
	p   core.Policy
}

func (e *jenc) open(typ byte) int {
	start := len(e.buf)
	e.buf = append(e.buf, 0, 0, 0, 0, typ)
	return start
}

func (e *jenc) close(start int) {
	binary.LittleEndian.PutUint32(e.buf[start:], uint32(len(e.buf)-start-4))
	e.buf = append(e.buf, 0, 0, 0, 0) // the CRC, filled in by fillCRC
}

func (e *jenc) uv(v uint64)  { e.buf = binary.AppendUvarint(e.buf, v) }
func (e *jenc) v(v int64)    { e.buf = binary.AppendVarint(e.buf, v) }
func (e *jenc) str(s string) { e.uv(uint64(len(s))); e.buf = append(e.buf, s...) }
func (e *jenc) flag(b bool) {
	if b {
		e.buf = append(e.buf, 1)
	} else {
		e.buf = append(e.buf, 0)
	}
}

func samePolicy(a, b core.Policy) bool {
	return a.Name() == b.Name() && a.Limit() == b.Limit() && a.Interval() == b.Interval() && a.Algorithm().Name() == b.Algorithm().Name()
}

// policy returns p's index in the stream, defining it first if needed.
func (e *jenc) policy(p core.Policy) uint64 {
	if e.lastName != "" && e.lastName == p.Name() && samePolicy(e.lastPol.p, p) {
		return e.lastPol.idx
	}
	d, ok := e.pols[p.Name()]
	if !ok || !samePolicy(d.p, p) {
		if e.pols == nil {
			e.pols = make(map[string]jpol)
		}
		d = jpol{idx: e.npol, p: p}
		e.npol++
		e.pols[p.Name()] = d
		s := e.open(recPolicy)
		e.uv(d.idx)
		e.str(p.Name())
		e.str(p.Algorithm().Name())
		e.v(p.Limit())
		e.v(int64(p.Interval()))
		e.close(s)
	}
	e.lastName, e.lastPol = p.Name(), d
	return d.idx
}

// reset forgets the stream's policy table: the next records go to a new
// file.
func (e *jenc) reset() {
	e.pols, e.npol, e.lastName = nil, 0, ""
}

func (e *jenc) header() {
	s := e.open(recHeader)
	e.str(journalMagic)
	e.uv(journalVersion)
	e.close(s)
}

// count records the instance count, the clock offset, the data epoch and
// the highest data generation read (0: none read yet; a record without
// them, from an earlier holdfast, reads as 0).
func (e *jenc) count(n, offset, epoch, gen int64) {
	s := e.open(recCount)
	e.v(n)
	e.v(offset)
	e.v(epoch)
	e.v(gen)
	e.close(s)
}

// grantHead encodes a grant record up to its fixed cost and time fields and
// returns the record's start and the client key's offset.
func (e *jenc) grant(flags byte, pi uint64, n int64, keyPrefix, policy, key, skey string, seed driver.Seed, id string, cost, at int64) (start, keyOff int) {
	start = e.open(recGrant)
	e.buf = append(e.buf, flags)
	e.uv(pi)
	e.v(n)
	if skey != "" {
		e.str(skey)
		keyOff = -1
	} else {
		e.uv(uint64(len(keyPrefix) + len(policy) + len(key) + 3))
		keyOff = len(e.buf) + len(keyPrefix) + len(policy) + 2
		e.buf = driver.AppendStorageKey(e.buf, keyPrefix, policy, key)
	}
	e.v(seed.Value)
	e.v(seed.At)
	e.str(id)
	e.buf = binary.LittleEndian.AppendUint64(e.buf, uint64(cost))
	e.buf = binary.LittleEndian.AppendUint64(e.buf, uint64(at))
	e.close(start)
	return start, keyOff
}

func (e *jenc) known(pi uint64, skey string, k known) {
	s := e.open(recKnown)
	e.uv(pi)
	e.str(skey)
	e.v(k.seed.Value)
	e.v(k.seed.At)
	e.v(k.at)
	e.close(s)
}

func (e *jenc) replayed(pi uint64, skey string, to int64, grants []driver.Grant) {
	s := e.open(recReplayed)
	e.uv(pi)
	e.str(skey)
	e.v(to)
	e.uv(uint64(len(grants)))
	for _, g := range grants {
		e.str(g.ID)
		e.v(g.Cost)
		e.v(g.At)
	}
	e.close(s)
}

func (e *jenc) lease(pi uint64, p core.Policy, skey string, k *keyState) {
	s := e.open(recLease)
	e.uv(pi)
	e.str(skey)
	e.v(k.known.seed.Value)
	e.v(k.known.seed.At)
	e.v(k.known.at)
	e.v(k.seed.Value)
	e.v(k.seed.At)
	e.flag(k.leased)
	e.v(k.last)
	blob := appendLease(nil, k) // the algorithm's part, length-prefixed
	e.uv(uint64(len(blob)))
	e.buf = append(e.buf, blob...)
	e.close(s)
}

// appendLease appends k's lease as its algorithm encodes it
// (driver.Lease.AppendBinary); nothing when k has no lease.
func appendLease(b []byte, k *keyState) []byte {
	if k.lease == nil {
		return b
	}
	return k.lease.AppendBinary(b)
}

// loadLease decodes appendLease's bytes into k, with p's algorithm's
// driver.Leaser.LoadLease.
func loadLease(p core.Policy, data []byte, k *keyState) bool {
	if len(data) == 0 {
		return true // no lease was written
	}
	lr, ok := p.Algorithm().(driver.Leaser)
	if !ok {
		return false
	}
	l, err := lr.LoadLease(p, data)
	if err != nil {
		return false
	}
	k.lease = l
	return true
}

// resetRec encodes a recReset or recResetDone record.
func (e *jenc) resetRec(typ byte, skey, id string) {
	st := e.open(typ)
	e.str(skey)
	e.str(id)
	e.close(st)
}

func (e *jenc) sealed(pi uint64, b *driver.Batch) {
	s := e.open(recSealed)
	e.str(b.ID)
	e.uv(pi)
	e.str(b.Key)
	e.v(b.Seed.Value)
	e.v(b.Seed.At)
	e.uv(uint64(len(b.Grants)))
	for _, g := range b.Grants {
		e.str(g.ID)
		e.v(g.Cost)
		e.v(g.At)
	}
	e.close(s)
}

// fillCRC fills in the CRC of every record in b.
func fillCRC(b []byte) {
	for o := 0; o < len(b); {
		n := int(binary.LittleEndian.Uint32(b[o:]))
		binary.LittleEndian.PutUint32(b[o+4+n:], crc32.Checksum(b[o+4:o+4+n], castagnoli))
		o += 8 + n
	}
}

// readFrames calls f with each record's payload in b, in order, and stops
// at the first record that is torn, fails its CRC, or that f refuses. It
// returns the bytes read up to there.
func readFrames(b []byte, f func([]byte) error) (int, error) {
	o := 0
	for o < len(b) {
		if len(b)-o < 8 {
			return o, errTorn
		}
		n := int(binary.LittleEndian.Uint32(b[o:]))
		if n > len(b)-o-8 {
			return o, errTorn
		}
		payload := b[o+4 : o+4+n]
		if crc32.Checksum(payload, castagnoli) != binary.LittleEndian.Uint32(b[o+4+n:]) {
			return o, errDamaged
		}
		if n == 0 {
			return o, errBadRec
		}
		if err := f(payload); err != nil {
			return o, err
		}
		o += 8 + n
	}
	return o, nil
}

// jdec decodes one record's fields; a short or bad field sets bad.
type jdec struct {
	b   []byte
	bad bool
}

func (d *jdec) fail() { d.bad, d.b = true, nil }

func (d *jdec) uv() uint64 {
	v, n := binary.Uvarint(d.b)
	if n <= 0 {
		d.fail()
		return 0
	}
	d.b = d.b[n:]
	return v
}

func (d *jdec) v() int64 {
	v, n := binary.Varint(d.b)
	if n <= 0 {
		d.fail()
		return 0
	}
	d.b = d.b[n:]
	return v
}

func (d *jdec) byte1() byte {
	if len(d.b) < 1 {
		d.fail()
		return 0
	}
	c := d.b[0]
	d.b = d.b[1:]
	return c
}

func (d *jdec) u64() uint64 {
	if len(d.b) < 8 {
		d.fail()
		return 0
	}
	v := binary.LittleEndian.Uint64(d.b)
	d.b = d.b[8:]
	return v
}

func (d *jdec) str() string { return string(d.bytes()) }

// bytes reads a string field without copying it.
func (d *jdec) bytes() []byte {
	n := d.uv()
	if n > uint64(len(d.b)) {
		d.fail()
		return nil
	}
	s := d.b[:n:n]
	d.b = d.b[n:]
	return s
}

// count reads a count of items each at least min bytes long.
func (d *jdec) count(min int) int {
	n := d.uv()
	if n > uint64(len(d.b)/min) {
		d.fail()
		return 0
	}
	return int(n)
}

func (d *jdec) ok() bool { return !d.bad && len(d.b) == 0 }

// jstate is what a journal says: the flusher's mirror of the file, and what
// New restores.
type jstate struct {
	header  bool
	pols    map[uint64]core.Policy
	keys    map[string]*jkey
	sealed  map[string]*driver.Batch
	order   []string          // sealed batch ids in sealing order (acked ones linger until trimmed)
	resets  map[string]string // pending resets: storage key → marker id
	count   int64
	offset  int64
	epoch   int64
	gen     int64
	counted bool
	open    int // open grant entries
	maxOpen int
	// lastCompact is the store time of the last compaction of the open
	// grants that left them at the bound.
	lastCompact int64
	records     int
}

// jkey is one key's known state, lease and open grants.
type jkey struct {
	p       core.Policy
	ks      keyState       // known, seed and lease (deny and live unused)
	open    []driver.Grant // logged, not sealed yet
	seed    driver.Seed    // the open grants' seed
	group   int64          // when the last open token bucket grant's group began
	touched int64          // store time of the key's last record
}

func newJState(maxOpen int) *jstate {
	return &jstate{pols: map[uint64]core.Policy{}, keys: map[string]*jkey{}, sealed: map[string]*driver.Batch{}, resets: map[string]string{}, maxOpen: maxOpen}
}

func (st *jstate) key(skey []byte, p core.Policy) *jkey {
	k := st.keys[string(skey)] // no copy for a key already there
	if k == nil {
		k = &jkey{}
		st.keys[string(skey)] = k
	}
	k.p = p
	return k
}

func (k *jkey) touch(at int64) { k.touched = max(k.touched, at) }

// pending is the grant entries of the outage log the state holds.
func (st *jstate) pending() int {
	n := st.open
	for _, b := range st.sealed {
		n += len(b.Grants)
	}
	return n
}

// apply applies one record's payload.
func (st *jstate) apply(b []byte) error {
	typ := b[0]
	d := jdec{b: b[1:]}
	if !st.header && typ != recHeader {
		return fmt.Errorf("%w: no header", errBadRec)
	}
	pol := func() (core.Policy, bool) {
		p, ok := st.pols[d.uv()]
		if !ok {
			d.fail()
		}
		return p, ok
	}
	switch typ {
	case recHeader:
		magic, ver := d.str(), d.uv()
		if !d.ok() || magic != journalMagic {
			return fmt.Errorf("%w: not a holdfast journal", errBadRec)
		}
		if ver != journalVersion {
			return fmt.Errorf("%w: journal format version %d, this holdfast reads %d", errVersion, ver, journalVersion)
		}
		st.header = true
	case recPolicy:
		idx, name, alg, limit, iv := d.uv(), d.str(), d.str(), d.v(), d.v()
		if !d.ok() {
			return errBadRec
		}
		a, err := algorithmByName(alg)
		if err != nil {
			return err
		}
		p, err := driver.NewPolicy(name, a, limit, time.Duration(iv))
		if err != nil {
			return err
		}
		st.pols[idx] = p
	case recCount:
		n, off := d.v(), d.v()
		var epoch, gen int64
		if len(d.b) > 0 {
			epoch = d.v()
		}
		if len(d.b) > 0 {
			gen = d.v()
		}
		if !d.ok() || n < 1 || epoch < 0 || gen < 0 {
			return errBadRec
		}
		st.count, st.offset, st.epoch, st.gen, st.counted = n, off, epoch, gen, true
	case recGrant:
		flags := d.byte1()
		p, _ := pol()
		n, skey := d.v(), d.bytes()
		seed := driver.Seed{Value: d.v(), At: d.v()}
		id := d.str()
		cost, at := int64(d.u64()), int64(d.u64())
		if !d.ok() || cost <= 0 || n < 1 {
			return errBadRec
		}
		st.grant(flags, p, n, skey, seed, driver.Grant{ID: id, Cost: cost, At: at})
	case recKnown:
		p, _ := pol()
		skey := d.bytes()
		kn := known{seed: driver.Seed{Value: d.v(), At: d.v()}, at: d.v()}
		if !d.ok() {
			return errBadRec
		}
		k := st.key(skey, p)
		k.ks.known = kn
		k.touch(kn.at)
	case recLease:
		p, _ := pol()
		skey := d.bytes()
		var ks keyState
		ks.known = known{seed: driver.Seed{Value: d.v(), At: d.v()}, at: d.v()}
		ks.seed = driver.Seed{Value: d.v(), At: d.v()}
		ks.leased, ks.last = d.byte1() == 1, d.v()
		blob := d.bytes()
		if !d.ok() || !loadLease(p, blob, &ks) {
			return errBadRec
		}
		k := st.key(skey, p)
		k.ks = ks
		k.touch(max(ks.last, ks.known.at))
	case recSealed:
		id := d.str()
		p, _ := pol()
		skey := d.str()
		seed := driver.Seed{Value: d.v(), At: d.v()}
		grants := make([]driver.Grant, d.count(3))
		for i := range grants {
			grants[i] = driver.Grant{ID: d.str(), Cost: d.v(), At: d.v()}
		}
		if !d.ok() {
			return errBadRec
		}
		if _, dup := st.sealed[id]; !dup {
			st.order = append(st.order, id)
		}
		st.sealed[id] = &driver.Batch{ID: id, Key: skey, Policy: p, Seed: seed, Grants: grants}
		if k := st.keys[skey]; k != nil {
			st.open -= len(k.open)
			k.open = nil
		}
	case recAcked:
		ids := make([]string, d.count(1))
		for i := range ids {
			ids[i] = d.str()
		}
		if !d.ok() {
			return errBadRec
		}
		for _, id := range ids {
			delete(st.sealed, id)
		}
		if len(st.order) > 2*len(st.sealed)+64 {
			st.order = slices.DeleteFunc(st.order, func(id string) bool { return st.sealed[id] == nil })
		}
	case recReplayed:
		p, _ := pol()
		skey := d.bytes()
		to := d.v()
		grants := make([]driver.Grant, d.count(3))
		for i := range grants {
			grants[i] = driver.Grant{ID: d.str(), Cost: d.v(), At: d.v()}
		}
		if !d.ok() || to <= 0 {
			return errBadRec
		}
		k := st.key(skey, p)
		k.ks.addReplayed(p, grants, to, to)
		k.touch(to)
	case recReset:
		skey, id := d.str(), d.str()
		if !d.ok() || id == "" {
			return errBadRec
		}
		if k := st.keys[skey]; k != nil {
			st.open -= len(k.open)
			delete(st.keys, skey)
		}
		for bid, b := range st.sealed {
			if b.Key == skey {
				delete(st.sealed, bid)
			}
		}
		st.resets[skey] = id
	case recResetDone:
		skey, id := d.str(), d.str()
		if !d.ok() {
			return errBadRec
		}
		if st.resets[skey] == id {
			delete(st.resets, skey)
		}
	default:
		return fmt.Errorf("%w: unknown record type %q", errBadRec, typ)
	}
	st.records++
	return nil
}

// grant applies a grant record: it charges the key's lease and logs it.
func (st *jstate) grant(flags byte, p core.Policy, n int64, skey []byte, seed driver.Seed, gr driver.Grant) {
	k := st.key(skey, p)
	if flags&grantLeased != 0 {
		if !k.ks.leased || k.ks.seed != seed {
			// The lease (re)started from the known state this seed is.
			k.ks.known = known{seed: seed, at: seed.At}
			k.ks.leased = false
		}
		k.ks.charge(p, n, gr.At, gr.Cost)
	}
	if flags&grantLogged != 0 {
		st.addOpen(k, gr, seed, flags&grantWhole != 0)
	}
	k.touch(gr.At)
}

// addOpen adds a logged grant to k's open grants; token bucket grants
// within coalesceMicros of their group's first join it, as in the outage log.
func (st *jstate) addOpen(k *jkey, gr driver.Grant, seed driver.Seed, whole bool) {
	if len(k.open) == 0 {
		k.seed = seed
	} else if !whole && gr.ID == "" && coalesces(k.p) && gr.At-k.group < coalesceMicros {
		last := &k.open[len(k.open)-1]
		last.Cost += gr.Cost
		last.At = max(last.At, gr.At)
		return
	}
	k.open = append(k.open, gr)
	k.group = gr.At
	st.open++
	if st.open > st.maxOpen && gr.At-st.lastCompact >= 1_000_000 {
		st.compactOpen(gr.At)
	}
}

// compactOpen shrinks the open grants as outageLog.compactLocked does: a
// token bucket key's merge into one at the latest time, sliding window
// grants outside their window go.
func (st *jstate) compactOpen(now int64) {
	for _, k := range st.keys {
		n := len(k.open)
		co := coalesces(k.p)
		if n < 2 && (n == 0 || co) {
			continue
		}
		if co {
			m := k.open[n-1]
			for _, g := range k.open[:n-1] {
				m.Cost += g.Cost
				m.At = max(m.At, g.At)
			}
			k.open = append(k.open[:0], m)
		} else {
			k.open = slices.DeleteFunc(k.open, func(g driver.Grant) bool { return outdated(k.p, g.At, now) })
		}
		st.open -= n - len(k.open)
	}
	if st.open > st.maxOpen {
		st.lastCompact = now
	}
}

// charge spends a grant of cost units at store time at from the lease, as
// decideLease does when it admits one, without deciding: a grant already
// made is charged whatever the lease holds. A coalesced grant (the sum of
// several, at the latest of their times) leaves the lease with at most the
// credit the single grants would have.
func (k *keyState) charge(p core.Policy, n, at, cost int64) {
	if !k.leased || k.lease == nil {
		if !k.startLease(p, at) {
			return
		}
	}
	k.leased, k.last = true, max(k.last, at)
	k.lease.Charge(p, n, at, cost)
}

// prune keeps the known states and leases of at most max keys besides the
// keys with open grants: the most recently used.
func (st *jstate) prune(limit int) {
	var idle []string
	for skey, k := range st.keys {
		if len(k.open) > 0 {
			continue
		}
		if !k.ks.leased && k.ks.known.at == 0 && k.ks.replayed == nil {
			delete(st.keys, skey) // nothing known
			continue
		}
		idle = append(idle, skey)
	}
	if extra := len(st.keys) - limit; extra > 0 && len(idle) > 0 {
		slices.SortFunc(idle, func(a, b string) int { return cmp.Compare(st.keys[a].touched, st.keys[b].touched) })
		for _, skey := range idle[:min(extra, len(idle))] {
			delete(st.keys, skey)
		}
	}
}

// snapshot encodes the state as a fresh file into e, whose policy table
// becomes the state's.
func (st *jstate) snapshot(e *jenc) {
	e.header()
	st.header = true
	if st.counted {
		e.count(st.count, st.offset, st.epoch, st.gen)
	}
	// Pending resets first: what follows is the keys' state since.
	for _, skey := range slices.Sorted(maps.Keys(st.resets)) {
		e.resetRec(recReset, skey, st.resets[skey])
	}
	skeys := slices.Sorted(maps.Keys(st.keys))
	for _, skey := range skeys {
		if k := st.keys[skey]; k.ks.leased || k.ks.known.at > 0 {
			e.lease(e.policy(k.p), k.p, skey, &k.ks)
		}
	}
	// After the leases, whose records replace a key's whole state.
	for _, skey := range skeys {
		if k := st.keys[skey]; k.ks.replayed != nil {
			e.replayed(e.policy(k.p), skey, k.ks.replayed.to, k.ks.replayed.grants)
		}
	}
	order := st.order[:0]
	for _, id := range st.order {
		if b := st.sealed[id]; b != nil {
			e.sealed(e.policy(b.Policy), b)
			order = append(order, id)
		}
	}
	st.order = order
	for _, skey := range skeys {
		k := st.keys[skey]
		for _, g := range k.open {
			e.grant(grantLogged|grantWhole, e.policy(k.p), 1, "", "", "", skey, k.seed, g.ID, g.Cost, g.At)
		}
	}
	st.pols = make(map[uint64]core.Policy, len(e.pols))
	for _, d := range e.pols {
		st.pols[d.idx] = d.p
	}
}

// journalPath is the Limiter's journal in the state dir.
func (l *cell) journalPath() string {
	return l.statePath(".journal")
}

// statePath names a state dir file of this Limiter (its shard's cell too).
func (l *cell) statePath(ext string) string {
	name := "holdfast-" + l.o.ID
	if l.tag != "" {
		name += "." + l.tag
	}
	return filepath.Join(l.o.StateDir, name+ext)
}

// openJournal reads the state dir's journal back into the Limiter (or the
// outage log an earlier holdfast saved as JSON), writes it afresh and
// starts journaling. The flusher starts with Start.
func (l *cell) openJournal() error {
	if err := os.MkdirAll(l.o.StateDir, 0o700); err != nil {
		return fmt.Errorf("fallback: state dir: %w", err)
	}
	j := &journal{
		path: l.journalPath(), legacy: l.statePath(".outage-log.json"),
		keyPrefix: l.o.Prefix, every: l.o.StateFlush, maxKeys: l.o.StateKeys,
		logger: l.o.Logger, id: l.o.ID, leases: l.leases, recent: &l.recent,
		counts: func() (int64, int64, int64, int64) {
			return l.instances.Load(), l.offset.Load(), l.epoch.Load(), l.gen.Load()
		},
		kick: make(chan struct{}, 1), syncs: make(chan chan struct{}), stop: make(chan struct{}), done: make(chan struct{}),
		coal: jcoal{off: -1},
	}
	st := newJState(l.o.MaxLogGrants)
	data, err := os.ReadFile(j.path)
	switch {
	case err == nil:
		good, rerr := readFrames(data, st.apply)
		if errors.Is(rerr, errVersion) {
			// Written by another holdfast: not overwritten.
			return fmt.Errorf("fallback: state dir %s: %w", j.path, rerr)
		}
		if rerr != nil {
			j.restored.dropped = len(data) - good
			attrs := []any{"instance", l.o.ID, "path", j.path, "kept_bytes", good, "dropped_bytes", len(data) - good, "err", rerr}
			if !errors.Is(rerr, errTorn) {
				// Not a crash's torn tail: keep the file for inspection.
				keep := j.path + ".damaged"
				if err := os.WriteFile(keep, data, 0o600); err == nil {
					attrs = append(attrs, "copy", keep)
				}
				l.o.Logger.Error("holdfast journal damaged: restored the records before the damage", attrs...)
			} else {
				l.o.Logger.Warn("holdfast journal ends in a torn record (a crash while writing): restored every record before it", attrs...)
			}
		}
	case errors.Is(err, os.ErrNotExist):
		if err := readLegacyState(j.legacy, st); err != nil {
			return err
		}
	default:
		return fmt.Errorf("fallback: state dir: %w", err)
	}
	j.restored = l.restore(st, j.restored.dropped)
	j.st = st
	if err := j.compact(); err != nil {
		return fmt.Errorf("fallback: state dir: %w", err)
	}
	if err := os.Remove(j.legacy); err != nil && !errors.Is(err, os.ErrNotExist) {
		l.o.Logger.Warn("holdfast state file", "instance", l.o.ID, "err", err)
	}
	if r := j.restored; r.sealed+r.open+r.keys > 0 || st.counted {
		l.o.Logger.Info("holdfast restored state", "instance", l.o.ID, "path", j.path, "sealed_batches", r.sealed,
			"open_grants", r.open, "units", r.cost, "keys", r.keys, "instances", r.instances)
	}
	l.jnl = j
	l.log.journal = j
	return nil
}

// restore gives the Limiter what st holds.
func (l *cell) restore(st *jstate, dropped int) jrestored {
	r := jrestored{instances: int64(l.o.ExpectedInstances), dropped: dropped}
	if st.counted {
		r.instances = max(r.instances, st.count)
		l.countKnown.Store(true)
		l.offset.Store(st.offset)
		// The epoch read before the restart: a Redis that lost its data
		// meanwhile is found at the first read (see noteEpoch).
		l.epoch.Store(st.epoch)
		l.gen.Store(st.gen)
	}
	l.instances.Store(r.instances)
	for skey, id := range st.resets {
		l.resets.add(skey, id)
	}
	for _, id := range st.order {
		if b := st.sealed[id]; b != nil {
			cp := *b
			cp.Grants = slices.Clone(b.Grants)
			l.log.restore(&cp)
			r.sealed++
			for _, g := range b.Grants {
				r.cost += g.Cost
			}
		}
	}
	for skey, k := range st.keys {
		for _, g := range k.open {
			if err := l.log.add(skey, k.p, k.seed, g); err != nil {
				l.o.Logger.Error("holdfast restored grant not logged", "instance", l.o.ID, "err", err)
				continue
			}
			r.open++
			r.cost += g.Cost
		}
		if !k.ks.leased && k.ks.known.at == 0 && k.ks.replayed == nil {
			continue
		}
		ks := k.ks
		if r := ks.replayed; r != nil {
			// The mirror keeps its own, as for the lease.
			ks.replayed = &replayedGrants{grants: slices.Clone(r.grants), to: r.to}
		}
		if ks.lease != nil {
			// The mirror keeps its own: the live one gets a copy.
			if c := cloneLease(k.p, ks.lease); c != nil {
				ks.lease = c
			}
		}
		// Kept for as long as a lease or known state can matter: twice the
		// policy's quota window (a token bucket refilled; a window and
		// the one before), at the instance count's share.
		ttl := leaseTTL(k.p, r.instances)
		if ks.known.at > 0 || ks.replayed != nil {
			ks.tracked = l.recent.add(skey, k.p) // restored too if Redis lost its data meanwhile
		}
		l.leases.Update(skey, func(any, int64) (any, int64) { return &ks, ttl })
		r.keys++
	}
	return r
}

// start starts the flusher.
func (j *journal) start() {
	j.running.Store(true)
	go j.run()
}

func (j *journal) run() {
	defer close(j.done)
	t := time.NewTicker(j.every)
	defer t.Stop()
	for {
		var durable chan struct{}
		select {
		case <-j.stop:
			return
		case <-t.C:
		case <-j.kick:
		case durable = <-j.syncs:
		}
		if j.outage.Swap(false) {
			j.writeKnown()
		}
		j.flush(false)
		if durable != nil {
			close(durable)
		}
	}
}

// syncNow has the flusher write and fsync what is buffered now, and
// returns once it has (or once the flusher has stopped). It is the
// journal's write-ahead point: the reconciler calls it between sealing
// batches and sending them, so that a batch Redis may have applied is on
// disk as sealed, under the id Redis marks, before Redis sees it. Without
// it a crash in the moment between the send and the next flush left the
// batch's grants on disk as open ones, which a restart sealed under new
// ids and replayed again: counted twice.
func (j *journal) syncNow() {
	if j == nil || !j.running.Load() {
		return
	}
	durable := make(chan struct{})
	select {
	case j.syncs <- durable:
	case <-j.done:
		return
	}
	select {
	case <-durable:
	case <-j.done:
	}
}

func (j *journal) kickNow() {
	select {
	case j.kick <- struct{}{}:
	default:
	}
}

// grant records a grant (a decision that admitted): flags say whether it is
// in the outage log and whether it was spent from the lease (seed, n). The
// request path: no syscall.
func (j *journal) grant(flags byte, p core.Policy, key string, seed driver.Seed, id string, cost, at, n int64) {
	j.mu.Lock()
	c := &j.coal
	if c.off >= 0 && id == "" && flags == c.flags && n == c.n && seed == c.seed && at-c.start < coalesceMicros &&
		p.Name() == c.name && string(j.enc.buf[c.keyOff:c.keyOff+c.keyLen]) == key {
		b := j.enc.buf[c.off:]
		binary.LittleEndian.PutUint64(b, binary.LittleEndian.Uint64(b)+uint64(cost))
		if at > c.at {
			c.at = at
			binary.LittleEndian.PutUint64(b[8:], uint64(at))
		}
		j.mu.Unlock()
		return
	}
	pi := j.enc.policy(p)
	_, keyOff := j.enc.grant(flags, pi, n, j.keyPrefix, p.Name(), key, "", seed, id, cost, at)
	if id == "" && coalesces(p) {
		*c = jcoal{off: len(j.enc.buf) - 20, keyOff: keyOff, keyLen: len(key), name: p.Name(), flags: flags, n: n, seed: seed, start: at, at: at}
	} else {
		c.off = -1
	}
	big := len(j.enc.buf) >= kickBytes
	j.mu.Unlock()
	if big {
		j.kickNow()
	}
}

// known records a key's known state.
func (j *journal) known(p core.Policy, skey string, k known) {
	j.mu.Lock()
	j.coal.off = -1
	j.enc.known(j.enc.policy(p), skey, k)
	j.mu.Unlock()
}

// reset records a Reset of skey (typ recReset) pending under marker id,
// or its application (recResetDone).
func (j *journal) reset(typ byte, skey, id string) {
	j.mu.Lock()
	j.coal.off = -1
	j.enc.resetRec(typ, skey, id)
	j.mu.Unlock()
}

// sealed records a batch the outage log just sealed. The log's lock is held.
func (j *journal) sealed(b *driver.Batch) {
	j.mu.Lock()
	j.coal.off = -1
	j.enc.sealed(j.enc.policy(b.Policy), b)
	j.mu.Unlock()
}

// acked records the batches whose error is nil as acknowledged.
func (j *journal) acked(batches []driver.Batch, errs []error) {
	j.mu.Lock()
	defer j.mu.Unlock()
	n := 0
	for i := range batches {
		if errs[i] == nil {
			n++
		}
	}
	if n == 0 {
		return
	}
	j.coal.off = -1
	s := j.enc.open(recAcked)
	j.enc.uv(uint64(n))
	for i, b := range batches {
		if errs[i] == nil {
			j.enc.str(b.ID)
		}
	}
	j.enc.close(s)
}

// replayed records the grants of the batches whose error is nil, which a
// replay applied in Redis by store time to (cell.noteReplayed).
func (j *journal) replayed(batches []driver.Batch, errs []error, to int64) {
	j.mu.Lock()
	defer j.mu.Unlock()
	for i := range batches {
		if b := &batches[i]; errs[i] == nil && len(b.Grants) > 0 {
			j.coal.off = -1
			j.enc.replayed(j.enc.policy(b.Policy), b.Key, to, b.Grants)
		}
	}
}

// outageBegan has the flusher write the tracked keys' known states now.
func (j *journal) outageBegan() {
	j.outage.Store(true)
	j.kickNow()
}

// writeKnown records the known state of the StateKeys most recent keys
// that the lease store still holds, each under its key's lock, so it falls
// in order with the key's grants.
func (j *journal) writeKnown() {
	for _, tk := range j.recent.snapshot(j.maxKeys) {
		j.leases.Update(tk.skey, func(prev any, _ int64) (any, int64) {
			if ks, _ := prev.(*keyState); ks != nil && ks.known.at > 0 {
				j.known(tk.p, tk.skey, ks.known)
			}
			return prev, -1 // unchanged
		})
	}
}

// flush writes the buffered records (and the instance count when it
// changed) and fsyncs, or rewrites the file when compaction is due (or
// force).
func (j *journal) flush(force bool) error {
	n, off, epoch, gen := j.counts()
	j.mu.Lock()
	// The generation rises with every read of it (10 a second): it is
	// written only with other records, so an idle instance writes nothing.
	// A generation kept lower than the last read only lets an older copy
	// taken after it go unfound.
	if n != j.wroteCount || off-j.wroteOff > 1000 || j.wroteOff-off > 1000 || epoch != j.wroteEpoch ||
		gen != j.wroteGen && len(j.enc.buf) > 0 {
		j.coal.off = -1
		j.enc.count(n, off, epoch, gen)
		j.wroteCount, j.wroteOff, j.wroteEpoch, j.wroteGen = n, off, epoch, gen
	}
	compact := force || j.broken || j.size >= max(compactBytes, 4*j.snapSize) ||
		(j.size > j.snapSize+logEmptySlack && len(j.st.sealed) == 0 && j.st.open == 0)
	b := j.enc.buf
	j.enc.buf = j.spare[:0]
	j.coal.off = -1
	if compact {
		j.enc.reset() // the next records go to the new file
	}
	j.mu.Unlock()
	defer func() {
		// b is the next swap's buffer (grown already: no copying while it
		// fills), unless a burst made it very large.
		if cap(b) <= 4*kickBytes {
			j.spare = b[:0]
		} else {
			j.spare = nil
		}
	}()
	if len(b) == 0 && !compact {
		return nil
	}
	fillCRC(b)
	if _, err := readFrames(b, j.st.apply); err != nil {
		j.logger.Error("holdfast journal: a record could not be read back", "instance", j.id, "err", err)
	}
	var err error
	if compact {
		err = j.compact()
	} else {
		err = j.append(b)
	}
	j.broken = err != nil
	if err != nil && time.Since(j.warned) >= time.Second {
		j.warned = time.Now()
		j.logger.Error("holdfast journal write failed: the state dir lags until a write succeeds", "instance", j.id, "path", j.path, "err", err)
	}
	return err
}

func (j *journal) append(b []byte) error {
	if j.f == nil {
		return errors.New("journal not open")
	}
	n, err := j.f.Write(b)
	j.size += int64(n)
	j.written += int64(n)
	if err != nil {
		return err
	}
	return j.f.Sync()
}

// compact writes the mirror as a fresh file in place of the journal.
func (j *journal) compact() error {
	j.st.prune(j.maxKeys)
	e := jenc{buf: make([]byte, 0, j.snapSize+j.snapSize/4+4096)}
	j.st.snapshot(&e)
	fillCRC(e.buf)
	tmp := j.path + ".tmp"
	if err := writeSynced(tmp, e.buf); err != nil {
		return err
	}
	if err := os.Rename(tmp, j.path); err != nil {
		return err
	}
	if d, err := os.Open(filepath.Dir(j.path)); err == nil {
		_ = d.Sync() // the rename is durable
		d.Close()
	}
	if j.f != nil {
		j.f.Close()
		j.f = nil
	}
	f, err := os.OpenFile(j.path, os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return err
	}
	j.f, j.size, j.snapSize = f, int64(len(e.buf)), int64(len(e.buf))
	j.written += int64(len(e.buf))
	j.compactions++
	return nil
}

func writeSynced(path string, b []byte) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return err
	}
	_, err = f.Write(b)
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}

// close stops the flusher and writes everything (a fresh snapshot). Later
// calls do nothing.
func (j *journal) close() error {
	if j == nil || !j.ended.CompareAndSwap(false, true) {
		return nil
	}
	j.stopFlusher()
	// The known states as they stand now, not as the last outage began:
	// if Redis loses its data before the next process starts, the restore
	// writes back what was spent up to the stop.
	j.writeKnown()
	err := j.flush(true)
	if p := j.st.pending(); p > 0 && err == nil {
		j.logger.Info("holdfast saved outage log", "instance", j.id, "batches", len(j.st.sealed), "grants", p, "path", j.path)
	}
	if j.f != nil {
		if cerr := j.f.Close(); err == nil {
			err = cerr
		}
		j.f = nil
	}
	return err
}

// abandon stops the journal as a crash would: the flusher ends, the file is
// closed, the buffer is lost. Later calls (and close) do nothing.
func (j *journal) abandon() {
	if j == nil || !j.ended.CompareAndSwap(false, true) {
		return
	}
	j.stopFlusher()
	if j.f != nil {
		j.f.Close()
		j.f = nil
	}
}

// stopFlusher stops the flusher; ended guards it to one call.
func (j *journal) stopFlusher() {
	close(j.stop)
	if j.running.Load() {
		<-j.done
	}
}

// savedBatch is a batch in the outage log file (JSON) that Close wrote
// before the journal; New still reads one.
type savedBatch struct {
	ID         string         `json:"id"`
	Key        string         `json:"key"`
	Policy     string         `json:"policy"`
	Algorithm  string         `json:"algorithm"`
	Limit      int64          `json:"limit"`
	IntervalUS int64          `json:"interval_us"`
	Seed       driver.Seed    `json:"seed"`
	Grants     []driver.Grant `json:"grants"`
}

// readLegacyState reads the outage log an earlier holdfast saved as JSON,
// if there is one, into st; its batches keep their ids.
func readLegacyState(path string, st *jstate) error {
	data, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	var saved []savedBatch
	if err := json.Unmarshal(data, &saved); err != nil {
		return fmt.Errorf("fallback: state file %s: %w", path, err)
	}
	st.header = true
	for _, s := range saved {
		alg, err := algorithmByName(s.Algorithm)
		if err != nil {
			return fmt.Errorf("fallback: state file %s: %w", path, err)
		}
		p, err := driver.NewPolicy(s.Policy, alg, s.Limit, time.Duration(s.IntervalUS)*time.Microsecond)
		if err != nil {
			return fmt.Errorf("fallback: state file %s: %w", path, err)
		}
		if _, dup := st.sealed[s.ID]; !dup {
			st.order = append(st.order, s.ID)
		}
		st.sealed[s.ID] = &driver.Batch{ID: s.ID, Key: s.Key, Policy: p, Seed: s.Seed, Grants: s.Grants}
	}
	return nil
}

// journalGrant records a grant in the state dir's journal, if there is one.
func (l *cell) journalGrant(flags byte, p core.Policy, key string, seed driver.Seed, id string, cost, at, n int64) {
	if l.jnl != nil {
		l.jnl.grant(flags, p, key, seed, id, cost, at, n)
	}
}

// leaseTTL is how long a restored key's state is kept: twice its policy's
// quota window (driver.Quotaer; else its interval), scaled up when the share
// of n instances is one unit, plus a second.
func leaseTTL(p core.Policy, n int64) int64 {
	units, w := p.Limit(), p.Interval()
	if q, ok := p.Algorithm().(driver.Quotaer); ok {
		units, w = q.Quota(p)
	}
	ttl := 2 * w.Microseconds()
	if n > units && units > 0 {
		ttl = ttl / units * n
	}
	return ttl + int64(time.Second/time.Microsecond)
}
