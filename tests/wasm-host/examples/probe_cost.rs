use std::time::Instant;
use tether_wasm_host::{HostOptions, Plugin, Request};
fn main() {
    let path = std::env::args().nth(1).unwrap();
    let cfg = std::env::args().nth(2).unwrap();
    let plugin = Plugin::new(&std::fs::read(path).unwrap(), false).unwrap();
    let mut vm = plugin.start(HostOptions { plugin_config: cfg.into_bytes(), ..Default::default() }).unwrap();
    let body = vec![b'x'; 4 << 20];
    for chunk in [1 << 20, 64 << 10, 16 << 10] {
        let req = Request { body_chunks: Request::chunked(&body, chunk), ..Request::post("/", &[], &[]) };
        for _ in 0..3 {
            let t = Instant::now();
            vm.run(&req).unwrap();
            println!("chunk {chunk}: {:?}", t.elapsed());
        }
    }
}
