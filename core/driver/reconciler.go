package driver

import "context"

// A Grant is one request admitted without the shared store, kept in the
// outage log until it is folded back into the store.
type Grant struct {
	// ID is the request's unique id.
	ID string
	// Cost is what the request spent.
	Cost int64
	// At is when it was admitted, in the store's clock (microseconds since the
	// Unix epoch), converted with the instance's tracked clock offset.
	At int64
}

// A Seed is an instance's last known state of a key, from the last store
// reply it saw: the reconciler writes it first when the store lost the key
// (restarted without persistence), so a restart hands out no fresh quota.
// For a token bucket Value is the credit in microseconds; for a sliding
// window, the units in the window. At is the store time it describes; zero
// means unknown.
type Seed struct {
	Value int64
	At    int64
}

// A Batch is the grants of one key replayed into the store as one
// idempotent unit.
type Batch struct {
	// ID names the batch uniquely: instance, outage epoch and sequence. The
	// store marks it applied in the same atomic step that applies it, so a
	// retried batch counts once.
	ID string
	// Key is the storage key (see StorageKey).
	Key string
	// Policy is the policy that admitted the grants.
	Policy Policy
	// Seed is the instance's last known state of Key.
	Seed Seed
	// Grants are the batch's grants, in time order.
	Grants []Grant
	// Since is set on a restore: a batch of no grants that writes the
	// seed back after Redis lost its data. It is a Redis time no later
	// than the loss, so a key that exists holds only what was decided
	// from then on, or (Redis went back to an older copy) an older state:
	// the replay adds the seed's usage to it (the token bucket and the
	// sliding window counter: errs high for an older state), or tops it
	// up to the seed's count (the sliding window); a missing key gets the
	// seed. Batches of several instances restoring one key after one loss
	// share their ID, so the first applies and the others are
	// acknowledged as applied before.
	Since int64
}

// A Reconciler folds an outage log back into the shared store.
type Reconciler interface {
	// Reconcile applies each batch exactly once and reports, per batch, nil
	// when the store acknowledged it (applied now or before) or the error.
	// The caller clears only acknowledged batches and retries the others
	// with the same ID.
	Reconcile(ctx context.Context, store Store, batches []Batch) []error
}
