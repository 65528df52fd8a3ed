use crate::support::*;
use serde_json::json;
use tether_e2e::agent::{Api, Conversation};
use tether_e2e::bootstrap;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn debug_spoof() {
    let f = Fleet::pick(bootstrap::DEMO, 4, &[1, 1, 1, 2], json!({}), &[]);
    let conv = Conversation::new(Api::Responses, "sys", &[], "hi");
    let honest = f.echo(header_turn(&conv, "honest-session", None)).await;
    println!("HONEST {} {:#?}", honest.rank, honest.headers);
    let victim = f.ranks.iter().find(|r| r.name() != honest.rank).unwrap().addr().to_string();
    let e = f.echo(header_turn(&conv, "honest-session", None).header("x-gateway-destination-endpoint", &victim)).await;
    println!("SPOOF victim={victim} {} {:#?}", e.rank, e.headers);
    let e = f.echo(header_turn(&conv, "honest-session", None).header("x-forwarded-for", "1.2.3.4")).await;
    println!("XFF {:#?}", e.headers);
}
