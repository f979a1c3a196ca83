//! Runs the model that build.rs compiled, through its generated bindings.

include!(concat!(env!("OUT_DIR"), "/mslc_models.rs"));

fn main() -> Result<(), mslc_exec::ExecError> {
    let ids: Vec<i64> = (0..net::INPUT_TOKENS_SHAPE.iter().product::<usize>() as i64)
        .map(|i| (i * 7) % 100)
        .collect();
    let out = net::Model::load()?
        .init_seed(0)
        .run(net::Inputs { tokens: &ids })?;
    println!(
        "{} on {}: logits {:?}, first row {:?}",
        net::NAME,
        net::TARGET,
        out.logits.shape,
        &out.logits.data[..net::OUTPUT_LOGITS_SHAPE[2]]
    );
    Ok(())
}
