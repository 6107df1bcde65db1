//! Rebuilds when a migration changes: `sqlx::migrate!` embeds `migrations/` at
//! compile time, and cargo does not otherwise notice an edited `.sql` file.

fn main() {
    println!("cargo:rerun-if-changed=migrations");
}
