"""Memory planners: place every intermediate tensor of a schedule in one arena."""
