package tokenbucket

// For the tests of package tokenbucket_test: the expiry of a key holding
// E alone.
var (
	LifeMs  = lifeMs
	Quarter = quarter
)
